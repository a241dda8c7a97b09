"""The README's walkthrough: a Starlette app allowing each client IP 5
requests per 10 s, with ratelimitd deciding.

    cd clients/python/examples
    RATELIMITD_ADDRESS=127.0.0.1:50051 uvicorn app:app --port 8000

(FastAPI is the same: `app = FastAPI()`, then the same `add_middleware`.)
"""

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratelimitd_client import DEFAULT_DEADLINE

from asgi_middleware import RateLimitMiddleware


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world"})


def create_app(address: str, deadline: float = DEFAULT_DEADLINE) -> Starlette:
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(
        RateLimitMiddleware,
        address=address,
        deadline=deadline,
        type="fixed",
        limit=5,
        window_ms=10_000,
    )
    return app


app = create_app(os.environ.get("RATELIMITD_ADDRESS", "127.0.0.1:50051"))
