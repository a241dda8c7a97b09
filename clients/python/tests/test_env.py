"""The address and TLS from the environment: RATELIMITD_ADDRESS when no
address is given; RATELIMITD_TLS, RATELIMITD_TLS_CA, RATELIMITD_TLS_CERT and
RATELIMITD_TLS_KEY against a real ratelimitd serving TLS (and mutual TLS),
with certificates made by openssl for the test."""

import shutil
import subprocess

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimitd_client import AsyncClient, Client, RatelimitdError, credentials_from_env
from ratelimitd_client.asgi import Limiter, RateLimitMiddleware

from conftest import start_ratelimitd

TLS_VARIABLES = ("RATELIMITD_TLS", "RATELIMITD_TLS_CA", "RATELIMITD_TLS_CERT", "RATELIMITD_TLS_KEY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("RATELIMITD_ADDRESS", *TLS_VARIABLES):
        monkeypatch.delenv(name, raising=False)


def test_the_address_from_the_environment(ratelimitd, key, monkeypatch):
    assert Client().address == "127.0.0.1:50051"
    monkeypatch.setenv("RATELIMITD_ADDRESS", ratelimitd.address)
    with Client(deadline=2.0) as client:
        assert client.address == ratelimitd.address
        assert client.check(key, limit=1, window_ms=10_000).allowed
    # An address given wins.
    assert Client("10.0.0.1:1").address == "10.0.0.1:1"


async def test_the_middleware_reads_the_address_too(ratelimitd, key, monkeypatch):
    monkeypatch.setenv("RATELIMITD_ADDRESS", ratelimitd.address)
    limiter = Limiter(lambda request: key, deadline=2.0)
    assert limiter.client.address == ratelimitd.address

    @limiter.limit("1/minute")
    async def limited(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", limited)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert [(await client.get("/")).status_code for _ in range(2)] == [200, 429]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RATELIMITD_TLS": "yes"}, "RATELIMITD_TLS must be 1, true, 0 or false"),
        ({"RATELIMITD_TLS_CERT": "c.pem"}, "RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY go together"),
        ({"RATELIMITD_TLS": "0", "RATELIMITD_TLS_CA": "ca.pem"}, "RATELIMITD_TLS=0 but RATELIMITD_TLS_CA"),
        ({"RATELIMITD_TLS_CA": "/no/such/ca.pem"}, "RATELIMITD_TLS_CA=/no/such/ca.pem: cannot read it"),
    ],
)
def test_bad_tls_settings_are_errors(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        Client("127.0.0.1:1")


def test_no_tls_variables_is_plaintext(monkeypatch):
    assert credentials_from_env() is None
    monkeypatch.setenv("RATELIMITD_TLS", "false")
    assert credentials_from_env() is None
    monkeypatch.setenv("RATELIMITD_TLS", "1")
    assert credentials_from_env() is not None


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the TLS tests' certificates", pytrace=False)
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        cwd=d,
    )
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "subjectAltName=DNS:client")):
        openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    return d


def test_tls_from_the_environment(tmp_path, pki, key, monkeypatch):
    server = start_ratelimitd(
        tmp_path,
        args=["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")],
        tls_ca=pki / "ca.pem",
    )
    try:
        monkeypatch.setenv("RATELIMITD_ADDRESS", server.address)
        with Client(deadline=2.0) as plaintext, pytest.raises(RatelimitdError):
            plaintext.check(key, limit=5, window_ms=10_000)
        monkeypatch.setenv("RATELIMITD_TLS_CA", str(pki / "ca.pem"))
        with Client(deadline=2.0) as client:
            assert client.check(key, limit=5, window_ms=10_000).remaining == 4
    finally:
        assert server.stop() == 0


async def test_mutual_tls_from_the_environment(tmp_path, pki, key, monkeypatch):
    server = start_ratelimitd(
        tmp_path,
        args=[
            "--tls-cert",
            str(pki / "server.pem"),
            "--tls-key",
            str(pki / "server.key"),
            "--tls-client-ca",
            str(pki / "ca.pem"),
        ],
        tls_ca=pki / "ca.pem",
        tls_client=(pki / "client.pem", pki / "client.key"),
    )
    try:
        monkeypatch.setenv("RATELIMITD_ADDRESS", server.address)
        monkeypatch.setenv("RATELIMITD_TLS", "1")
        monkeypatch.setenv("RATELIMITD_TLS_CA", str(pki / "ca.pem"))
        async with AsyncClient(deadline=2.0) as anonymous:
            with pytest.raises(RatelimitdError):
                await anonymous.check(key, limit=5, window_ms=10_000)
        monkeypatch.setenv("RATELIMITD_TLS_CERT", str(pki / "client.pem"))
        monkeypatch.setenv("RATELIMITD_TLS_KEY", str(pki / "client.key"))
        async with AsyncClient(deadline=2.0) as client:
            assert (await client.check(key, limit=5, window_ms=10_000)).remaining == 4
    finally:
        assert server.stop() == 0
