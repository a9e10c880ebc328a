"""How `dapo serve` stops its server (engines/rollout/serving.py), with stand-in servers instead of vLLM.

A stand-in is a Python child that starts a grandchild (as vLLM's API server starts its engine
core) and either stops on SIGINT or ignores it (a server that hangs while stopping). The stop
must be prompt and leave no process behind, and a Ctrl-C must be honoured even when the kernel
hands it to a thread other than the main one (CPython then only sets a flag).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engines.rollout import serving

REPO = Path(__file__).resolve().parents[2]

# The stand-in server: prints its grandchild's pid, then waits; both ignore SIGINT if asked to.
_SERVER = """
import signal, subprocess, sys, time
stubborn = sys.argv[1] == "stubborn"
child = ("import signal, time\\n" + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\\n" if stubborn else "")
         + "time.sleep(600)")
core = subprocess.Popen([sys.executable, "-c", child])
if stubborn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
try:  # the pid is the ready signal: printed inside the try, so a SIGINT right after it is caught
    print(core.pid, flush=True)
    time.sleep(600)
except KeyboardInterrupt:
    core.terminate()
    core.wait()
"""


def _start(kind: str) -> tuple[subprocess.Popen[bytes], int]:
    """A stand-in server and its grandchild's pid."""
    process = subprocess.Popen([sys.executable, "-c", _SERVER, kind], stdout=subprocess.PIPE)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_server_that_ignores_sigint_is_killed_with_its_children_after_the_grace() -> None:
    process, core = _start("stubborn")
    started = time.monotonic()
    try:
        assert serving.stop_server(process, timeout_s=1.0) == -signal.SIGKILL
        took = time.monotonic() - started
        deadline = time.monotonic() + 5
        while _alive(core) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(core), "the server's child outlived the stop (orphaned)"
        assert took < 10, f"stop took {took:.1f} s"
    finally:
        for pid in (process.pid, core):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def test_a_server_that_stops_on_sigint_exits_cleanly_with_its_children() -> None:
    process, core = _start("polite")
    try:
        assert serving.stop_server(process, timeout_s=30.0) == 0  # its KeyboardInterrupt handler returns: exit 0
        assert not _alive(core)
    finally:
        for pid in (process.pid, core):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait()


# serve_until_stopped in a process whose Ctrl-C is caught by a thread other than the main one.
_SERVING = """
import signal, subprocess, sys, threading, time
from engines.rollout import serving
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(server.pid, flush=True)

def ctrl_c_on_this_thread():
    time.sleep(0.5)  # the main thread is waiting for the server by now
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

threading.Thread(target=ctrl_c_on_this_thread).start()
sys.exit(serving.serve_until_stopped(server))
"""


def test_ctrl_c_caught_on_another_thread_still_stops_the_server() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _SERVING], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        server = int(proc.stdout.readline())
        assert proc.wait(timeout=60) == 130  # stopped by Ctrl-C (before the fix: waited for the server forever)
        assert not _alive(server)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_stop_by_sigterm_exits_143_and_stops_the_server() -> None:
    serving_main = _SERVING.replace("signal.SIGINT", "signal.SIGTERM").replace(
        "signal.pthread_kill(threading.get_ident(),", "os.kill(os.getpid(),").replace("import signal,", "import os, signal,")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", serving_main], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        server = int(proc.stdout.readline())
        assert proc.wait(timeout=60) == 143  # the shell's code for SIGTERM, as every dapo command exits
        assert not _alive(server)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_servers_temp_folder_is_used_only_where_its_socket_paths_fit(tmp_path: Path) -> None:
    # ZeroMQ refuses an ipc path over 107 bytes, and the server names its sockets with 36-character
    # uuids: a deeper temp folder would stop the server at its start (seen with a pytest folder).
    shallow, deep = Path("/tmp/dapo-serve-abcdefgh"), tmp_path / ("d" * 80)
    assert serving.socket_folder(shallow) == shallow and serving.socket_folder(deep) is None
    settings = serving.vllm_engine.EngineSettings()
    assert serving.server_environment(settings, shallow, on_cpu=True)["TMPDIR"] == str(shallow)
    assert serving.server_environment(settings, None, on_cpu=True).get("TMPDIR") == os.environ.get("TMPDIR")


def test_a_cpu_server_in_eager_mode_runs_vllms_compiled_helpers_eagerly() -> None:
    # vLLM's sampler compiles its log-prob rank counter on the first request that asks for
    # log-probs: 6.8 s for the first such request to a CPU server (0.03 s for the next). An engine
    # that compiles its model (enforce_eager=False, a GPU's) keeps torch.compile, as does a user's
    # own TORCHDYNAMO_DISABLE.
    eager = serving.vllm_engine.EngineSettings()
    compiled = serving.vllm_engine.EngineSettings(enforce_eager=False)
    assert serving.server_environment(eager, None, on_cpu=True).get("TORCHDYNAMO_DISABLE") == "1"
    assert "TORCHDYNAMO_DISABLE" not in serving.server_environment(eager, None, on_cpu=False)
    assert "TORCHDYNAMO_DISABLE" not in serving.server_environment(compiled, None, on_cpu=True)
