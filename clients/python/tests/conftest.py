"""Starts a real ratelimitd for the tests: on the embedded store (no Redis),
on a free loopback port, with JSON logs kept in a file for failures; with a
--config directory holding a policies file when a test needs named policies
(`policy_server`, or `start_ratelimitd(..., policies=...)`).

The binary is $RATELIMITD_BIN, else <repo>/target/debug/ratelimitd. Without
one the tests fail (never skip): build it with `cargo build --bin ratelimitd`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from ratelimitd_client import Client, RatelimitdError

REPO = Path(__file__).resolve().parents[3]
README = REPO / "clients" / "python" / "README.md"
START_TIMEOUT = 20.0
# How often the server looks at its --config directory: a rewritten
# policies file is in force within this (and a request's time).
CONFIG_POLL_INTERVAL = "50ms"

# The policies of `policy_server`, as an operator writes them. Counters are
# per key (tests keep apart by their keys) unless a limit says
# `scope: policy`: none here does.
POLICIES = """\
policies:
  # The README's example, with fixed windows: 10 a second (decided the same
  # however fast the machine), 1000 an hour.
  free-tier:
    - {per: 1s, limit: 10}
    - {per: 1h, limit: 1000}
  # A limit in shadow mode is reported, never denies.
  watched:
    - {per: 1h, limit: 5, name: enforced}
    - {per: 1h, limit: 1, name: trial, shadow_mode: true}
"""


def binary() -> Path:
    given = os.environ.get("RATELIMITD_BIN")
    path = Path(given) if given else REPO / "target" / "debug" / "ratelimitd"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"no ratelimitd binary at {path}: run `cargo build --bin ratelimitd` in {REPO}, "
            "or point RATELIMITD_BIN at one",
            pytrace=False,
        )
    return path


def free_port() -> int:
    """A loopback port nothing listens on (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    address: str
    process: subprocess.Popen
    log: Path
    #: Its --config directory (see `write_policies`), if it has one.
    config_dir: Path | None = None

    def stop(self) -> int:
        """SIGTERM (ratelimitd shuts down gracefully), then its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def write_policies(config_dir: Path, text: str) -> Path:
    """Writes `text` as the policies file of `config_dir` (a server's
    --config), whole: to a temporary file beside it, then renamed, so a
    running server never reads half of it."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / "policies.yaml"
    partial = config_dir / ".policies.yaml.partial"  # a dotfile: the server skips it
    partial.write_text(text)
    partial.replace(path)
    return path


def start_ratelimitd(
    log_dir: Path,
    port: int | None = None,
    *,
    policies: str | None = None,
    args: Sequence[str] = (),
    tls_ca: Path | None = None,
    tls_client: tuple[Path, Path] | None = None,
    host: str = "127.0.0.1",
) -> Server:
    """Starts ratelimitd and returns once it answers a CheckLimit.

    Without `port`, picks a free one, and picks again if another process
    took it in between (ratelimitd then exits at once). With `policies`
    (a policies file's text), the server's --config is a directory of
    `log_dir` holding it as policies.yaml, looked at every
    CONFIG_POLL_INTERVAL (rewrite it with `write_policies`). `args`: more
    flags; for a server serving TLS (--tls-cert), `tls_ca` is the CA to
    trust while waiting for it, and `tls_client` (certificate, key) the
    client's for mutual TLS. `host`: a loopback address to listen on."""
    credentials = None
    if tls_ca is not None:
        cert, key = tls_client or (None, None)
        credentials = grpc.ssl_channel_credentials(
            tls_ca.read_bytes(),
            key.read_bytes() if key else None,
            cert.read_bytes() if cert else None,
        )
    flags = list(args)
    config_dir = None
    if policies is not None:
        config_dir = log_dir / f"config-{uuid.uuid4().hex[:6]}"
        write_policies(config_dir, policies)
        flags += ["--config", str(config_dir), "--config-poll-interval", CONFIG_POLL_INTERVAL]
    for _ in range(3):
        listen = f"{host}:{port or free_port()}"
        log = log_dir / f"ratelimitd-{listen.replace(':', '-')}-{uuid.uuid4().hex[:6]}.log"
        # RATELIMITD_* variables (e.g. RATELIMITD_REDIS_URL) would override
        # the flags' defaults: the tests want the embedded store.
        env = {name: value for name, value in os.environ.items() if not name.startswith("RATELIMITD_")}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(binary()), "--listen", listen, "--http-listen=", "--log-format", "json", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        server = Server(listen, process, log, config_dir)
        if _wait_until_answering(server, credentials):
            return server
        server.stop()
        if port is not None:
            break
    pytest.fail(f"ratelimitd did not start on {listen}; its log:\n{log.read_text()}", pytrace=False)


def _wait_until_answering(server: Server, credentials: grpc.ChannelCredentials | None = None) -> bool:
    """Polls until the port takes connections, then until a CheckLimit is
    answered; False if the process exits first."""
    host, port = server.address.rsplit(":", 1)
    give_up = time.monotonic() + START_TIMEOUT
    # TCP first: a gRPC channel that finds the port closed backs off for a
    # while before it tries again, which would slow every start.
    while True:
        if server.process.poll() is not None or time.monotonic() > give_up:
            return False
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.01)
    with Client(server.address, deadline=0.5, credentials=credentials) as client:
        while True:
            try:
                client.check("ratelimitd-client-tests:ready", limit=1, window_ms=1, cost=0)
                return True
            except RatelimitdError:
                if server.process.poll() is not None or time.monotonic() > give_up:
                    return False
                time.sleep(0.01)


@pytest.fixture(scope="session")
def ratelimitd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ratelimitd for the whole session: tests keep apart by their keys."""
    server = start_ratelimitd(tmp_path_factory.mktemp("ratelimitd"))
    yield server
    code = server.stop()
    assert code == 0, f"ratelimitd exited {code} on SIGTERM; its log:\n{server.log.read_text()}"


@pytest.fixture(scope="session")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ratelimitd whose --config directory holds POLICIES, for the whole
    session: tests keep apart by their keys."""
    server = start_ratelimitd(tmp_path_factory.mktemp("ratelimitd-policies"), policies=POLICIES)
    yield server
    code = server.stop()
    assert code == 0, f"ratelimitd exited {code} on SIGTERM; its log:\n{server.log.read_text()}"


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key no other test uses."""
    return f"{request.node.name}:{uuid.uuid4().hex}"


_addresses = itertools.count(1)


def new_peer() -> tuple[str, int]:
    """An ASGI `client` (host, port) in a /56 nothing else uses: the default
    key is an IPv6 client's /56, so a limit keyed by client IP starts
    fresh for it."""
    return (f"2001:db8:{next(_addresses):x}:{uuid.uuid4().hex[:2]}00::1", 50000)


@pytest.fixture
def peer() -> tuple[str, int]:
    """A `new_peer()` for the test: limits keyed by client IP start fresh
    in each test."""
    return new_peer()


@pytest.fixture
def client(ratelimitd: Server) -> Iterator[Client]:
    # A generous deadline: these tests are about decisions, not latency.
    with Client(ratelimitd.address, deadline=2.0) as client:
        yield client


@pytest.fixture
def dead_address() -> str:
    """A loopback address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


def shared_vectors(name: str) -> dict:
    """The table `name` of clients/test-vectors/, which both clients' suites
    read."""
    try:
        return json.loads((REPO / "clients" / "test-vectors" / name).read_text())
    except OSError as err:
        raise AssertionError(
            f"cannot read the shared test vectors (in a ratelimitd checkout): {err}"
        ) from err


def assert_readme_states(rule: str) -> None:
    """Fails unless this client's README holds `rule`, whitespace aside, as
    the Node client's does."""

    def words(text: str) -> str:
        return re.sub(r"\s+", " ", text)

    assert words(rule) in words(README.read_text()), (
        f"README.md must state, as the Node client's README does:\n{rule}"
    )
