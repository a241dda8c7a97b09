"""The README's walkthrough: a Starlette app allowing each client IP 5
requests per 10 s on `/`, with ratelimitd deciding, and a health probe that
is never limited.

    cd clients/python/examples
    RATELIMITD_ADDRESS=127.0.0.1:50051 uvicorn app:app --port 8000

(FastAPI is the same: `@app.get("/")` above `@limiter.limit(...)`, and the
same `add_middleware`.)
"""

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratelimitd_client import DEFAULT_DEADLINE
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware


def create_app(address: str | None = None, deadline: float = DEFAULT_DEADLINE) -> Starlette:
    # address None: $RATELIMITD_ADDRESS, else 127.0.0.1:50051.
    limiter = Limiter(address=address, deadline=deadline)

    @limiter.limit("5/10 seconds")
    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    @limiter.exempt
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", hello), Route("/healthz", healthz)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    app.state.limiter = limiter
    return app


app = create_app()
