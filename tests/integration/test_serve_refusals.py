"""``dapo serve`` announces only a server of its own (engines/rollout/serving.py: ``check_address``,
``wait_until_ready``), without starting vLLM: its start is replaced by stand-ins here.

Before, on a port another server answered, ``dapo serve`` printed its "serves model" line at
once (the other server answered ``/v1/models``), clients reached the other model, and it failed
~28 s later with exit 1 when vLLM could not bind; ``--port 99999`` and ``--host 8.8.8.8`` also
started vLLM before failing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engines.rollout import serving
from storage import checkpoints
from cli.main import main
from workflows.exit_codes import BAD_INPUT, FAILED

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "assets" / "policies" / "tiny-addsub30"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    def start_server(command: list[str], env: dict[str, str], **popen: object) -> None:
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(serving, "start_server", start_server)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port a socket listens on (and never answers), as another server would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_is_refused_at_once(host: str, listening: int, no_vllm: None,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code = main(["serve", str(POLICY), "--host", host, "--port", str(listening)])
    captured = capsys.readouterr()
    assert code == BAD_INPUT, captured.err[-2000:]
    assert f"port {listening} is in use" in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "serves model" not in captured.out
    assert time.monotonic() - started < 10  # before the checkpoint is read or vLLM imported


@pytest.mark.parametrize(("args", "named"), [
    (["--port", "99999"], "--port 99999"),
    (["--port", "0"], "--port 0"),
    (["--host", "8.8.8.8"], "--host 8.8.8.8"),
    (["--host", "no-such-host.invalid"], "--host no-such-host.invalid"),
])
def test_an_address_that_cannot_be_listened_on_is_bad_input(args: list[str], named: str, no_vllm: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", str(POLICY), *args])
    err = capsys.readouterr().err
    assert code == BAD_INPUT, err[-2000:]
    assert err.startswith(f"dapo serve: error: {named}") and len(err.strip().splitlines()) == 1, err


def test_check_address_accepts_a_free_port() -> None:
    serving.check_address("127.0.0.1", _free_port())  # nothing raised, and nothing left bound:
    port = _free_port()
    serving.check_address("127.0.0.1", port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def _models_server(port: int, model_ids: list[str]) -> ThreadingHTTPServer:
    """An OpenAI-style server on ``port`` whose /v1/models lists ``model_ids``."""
    body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in model_ids]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_that_lists_another_model_is_not_announced(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Another server takes the port between the check and vLLM's start: dapo serve's own server
    # (here a process that never listens) is never ready, and the other one is not taken for it.
    port = _free_port()
    servers: list[ThreadingHTTPServer] = []

    def start_server(command: list[str], env: dict[str, str], **popen: object) -> subprocess.Popen[bytes]:
        servers.append(_models_server(port, ["someone-elses-model"]))
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    monkeypatch.setattr(serving, "start_server", start_server)
    try:
        code = main(["serve", str(POLICY), "--port", str(port), "--ready-timeout", "3"])
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    captured = capsys.readouterr()
    assert code == FAILED, captured.err[-2000:]
    assert "serves model" not in captured.out
    assert "someone-elses-model" in captured.err  # the error says who answered instead


def test_wait_until_ready_returns_once_its_own_model_is_listed() -> None:
    port = _free_port()
    model = checkpoints.read_info(POLICY).checkpoint_id
    server = _models_server(port, [model])
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert serving.wait_until_ready(process, f"http://127.0.0.1:{port}", model_name=model, timeout_s=10) == [model]
    finally:
        process.kill()
        process.wait()
        server.shutdown()
        server.server_close()
