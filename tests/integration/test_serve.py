"""``dapo serve`` and ``dapo ask`` on a tiny checkpoint built here, with the real vLLM (CPU) server.

One ``dapo serve`` process (in its own session, on a free port) serves the whole module; the
fixture waits for ``/v1/models`` with a timeout and fails with the server's log tail, and its
teardown kills the whole process group whatever happened. The OpenAI client (``openai``) talks
to it, as a user's code would. Starting the server (API process + engine core + worker) takes
30-150 s on two shared cores, so the module is slow.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

from dapo_core.rewards import score_responses
from engines.bootstrap import tiny_policy
from storage import checkpoints
from cli.ask import verdict_line
from workflows.config import load_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600.0
PROMPT = "3+4=\n"  # the tiny template applied to "3+4"


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DO_NOT_TRACK": "1", "PYTHONPATH": str(REPO)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path  # its stderr: vLLM's output and ours
    out: Path  # its stdout: the ready line alone
    system_temp: Path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy.build_random_checkpoint(tmp_path_factory.mktemp("serve") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    logs = tmp_path_factory.mktemp("serve-log")
    log, stdout = logs / "serve.log", logs / "serve.out"
    # Its TMPDIR, to see what it leaves there: short, as /tmp is (a pytest folder is too deep for the
    # server's socket paths, and dapo serve would then leave the system temp folder as it is).
    temp = Path(tempfile.mkdtemp(prefix="serve-tmp-", dir="/tmp"))
    with log.open("wb") as err, stdout.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", str(checkpoint), "--port", str(port), "--cpu-threads", "1"],
            cwd=REPO, env={**_env(), "TMPDIR": str(temp)}, stdout=out, stderr=err,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, url, log, stdout)
        yield Server(process, url, log, stdout, temp)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever is left of the session: the API server, engine core and worker
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, stdout: Path) -> None:
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dapo serve exited with code {process.returncode} before /v1/models answered; log tail:\n{_tail(log)}")
        try:
            # ready: the server answers, and dapo serve said so (its own check comes a moment later)
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200 and "dapo serve: http" in stdout.read_text():
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"dapo serve: /v1/models did not answer within {READY_TIMEOUT_S:.0f} s; log tail:\n{_tail(log)}")


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=60)


def test_serves_the_checkpoint_id_as_the_model_name(server: Server, checkpoint: Path) -> None:
    expected = checkpoints.read_info(checkpoint).checkpoint_id
    assert [m.id for m in _client(server).models.list()] == [expected]
    # stdout holds the ready line alone: vLLM's warnings and logs go to stderr (issue 48: 16 lines before it)
    assert server.out.read_text() == f"dapo serve: {server.url}/v1 serves model {expected!r} (step 0, {checkpoint}); Ctrl-C to stop\n"
    assert "WARNING" in server.log.read_text() or "INFO" in server.log.read_text()  # vLLM's output: on stderr


def _complete(server: Server, checkpoint: Path, **params) -> str:
    model = checkpoints.read_info(checkpoint).checkpoint_id
    response = _client(server).completions.create(model=model, prompt=PROMPT, max_tokens=12, **params)
    assert response.model == model
    return response.choices[0].text


def test_completions_are_text_and_a_seed_repeats_them(server: Server, checkpoint: Path) -> None:
    first = _complete(server, checkpoint, temperature=1.0, top_p=0.7, seed=1234)
    again = _complete(server, checkpoint, temperature=1.0, top_p=0.7, seed=1234)
    others = {_complete(server, checkpoint, temperature=1.0, top_p=0.7, seed=s) for s in range(5)}
    assert isinstance(first, str) and first
    assert again == first
    assert len(others) > 1  # the seed decides the sample (a random tiny model rarely repeats itself)


def test_greedy_completion_is_the_checkpoints_own(server: Server, checkpoint: Path) -> None:
    # What the server says is what transformers generates from the same weights (fp32, greedy).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    served = _complete(server, checkpoint, temperature=0.0, extra_body={"ignore_eos": True})
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = tokenizer(PROMPT).input_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, min_new_tokens=12,
                             eos_token_id=None, pad_token_id=0)
    assert served == tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


def test_chat_completions_render_the_tiny_chat_template(server: Server, checkpoint: Path) -> None:
    # The tiny tokenizer's chat template renders the user message verbatim, so a chat request is
    # the completion request of the same prompt: same seed, same answer.
    model = checkpoints.read_info(checkpoint).checkpoint_id
    chat = _client(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=1.0, top_p=0.7, seed=99,
    )
    assert chat.model == model
    assert chat.choices[0].message.content == _complete(server, checkpoint, temperature=1.0, top_p=0.7, seed=99)


def test_ctrl_c_stops_the_server_cleanly(server: Server) -> None:
    # Last in the module: it stops the shared server.
    ready = server.out.read_text()
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=60) == 130, _tail(server.log)  # Ctrl-C: 130, as for every command
    assert server.out.read_text() == ready  # nothing more on stdout
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, _tail(server.log, 80)
    port = int(server.url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    # The server's ZeroMQ sockets and rendezvous file stayed in the system temp folder after every
    # session (seven and one); now they live in a temp folder of dapo serve's, removed at the stop.
    # torch's compile cache is kept there on purpose, shared between sessions.
    left = [p.name for p in server.system_temp.iterdir() if not p.name.startswith("torchinductor_")]
    assert left == []


# ----------------------------------------------------------------------------- dapo ask


def test_verdict_line_by_hand() -> None:
    [right, wrong, silent] = score_responses(["3+4\nAnswer: 7", "3+4\nAnswer: 8", "3+4"], [7, 7, 7])
    assert verdict_line(right, "7") == "correct (answer 7, gold 7, reward +1)"
    assert verdict_line(wrong, "7") == "wrong (answer 8, gold 7, reward -1)"
    assert verdict_line(silent, "7") == "wrong (no answer, gold 7, reward -1)"


@pytest.fixture(scope="module")
def run_folder(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding the checkpoint as its step 0, whose run.json has its own template and sampling."""
    import shutil

    run = tmp_path_factory.mktemp("runs") / "tiny"
    shutil.copytree(checkpoint, run / "checkpoints" / "step-0000")
    config = load_config(REPO / "configs" / "tiny-cpu.yaml", ["evaluate.top_p=0.9", "evaluate.seed=5",
                                                              "rollout.cpu_threads=1"]).to_dict()
    config["curate"]["prompt_template"] = "A: {problem}=\n"
    (run / "run.json").write_text(json.dumps({"config": config}))
    return run


def _ask(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "ask", *args], cwd=REPO, env=_env(), check=False,
                          capture_output=True, text=True, timeout=600)


def test_ask_applies_the_runs_template_and_prints_each_verdict(run_folder: Path, checkpoint: Path) -> None:
    result = _ask(str(run_folder), "3+4", "--gold", "7", "--samples", "3", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    info = checkpoints.read_info(checkpoint)
    # the run folder means its final checkpoint; its template and evaluate sampling apply
    assert lines[0] == (f"checkpoint {info.checkpoint_id} (step 0); prompt 'A: 3+4=\\n'; temperature 1.0, top_p 0.9, "
                        "max 24 tokens, seed 5")
    heads = [line for line in lines if line.startswith("sample ")]
    texts = [ast.literal_eval(line.strip()) for line in lines if line.startswith("  ")]
    assert len(heads) == len(texts) == 3
    # each printed verdict is the reward's own verdict on the printed text
    for head, verdict in zip(heads, score_responses(texts, ["7"] * 3)):
        assert re.match(rf"sample \d/3: {re.escape(verdict_line(verdict, '7'))}; \d+ tokens, (stop|length)$", head), head
    assert lines[-1] == f"{sum(v.correct for v in score_responses(texts, ['7'] * 3))}/3 correct against gold 7"


def test_ask_outside_a_run_uses_the_template_flag(checkpoint: Path) -> None:
    result = _ask(str(checkpoint), "3+4", "--template", "{problem}=\n", "--top-p", "0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    first, head = result.stdout.splitlines()[:2]
    assert "prompt '3+4=\\n'; temperature 1.0, top_p 0.5, max 64 tokens, seed 0" in first
    assert head.startswith("sample 1/1: not judged (no --gold)")


def test_ask_names_a_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    result = _ask(str(tmp_path), "3+4")
    assert result.returncode == 2
    assert f"dapo ask: error: {tmp_path}: not a checkpoint folder" in result.stderr
