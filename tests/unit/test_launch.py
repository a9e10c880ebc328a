"""``dapo run --remote``: the config goes to the deployed driver task through the Flyte SDK's own remote run.

No backend here: the test stops the SDK at its one network call site (``_Runner._submit_remote``) and
records what it would send. Everything before it is the SDK's: the deployed task is a real
``TaskDetails`` holding the driver's serialised spec (``flyte.extras.serialize``, the wire format a
deploy registers), fetched through a real ``LazyEntity``, and the inputs are typed against that
interface by the SDK. The test decodes them back and compares them with the local loader's config.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flyte
import flyte._run
import flyte.errors
import flyte.extras
import flyte.remote
import pytest
from flyte.remote._task import LazyEntity, TaskDetails
from flyte.types import TypeEngine
from flyteidl2.task import task_definition_pb2

from cli import main as cli
from workflows import driver
from workflows.config import RunConfig, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"
DEPLOYED_IN = {("ml", "staging"), ("dapo", "development")}  # (project, domain) the fake backend holds the driver in
DEPLOYED_VERSION = "v7"
RUN_URL = "https://flyte.example/v2/runs/project/ml/domain/staging/abc123"


@dataclass
class FakeBackend:
    """What the command asked of Flyte: init, task look-ups and the run it would create."""

    inits: list[dict[str, Any]] = field(default_factory=list)
    lookups: list[dict[str, Any]] = field(default_factory=list)
    submitted: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class FakeRun:
    url: str


def deployed_driver(project: str, domain: str, version: str) -> TaskDetails:
    """The driver as a backend returns it: its serialised spec under a registered id."""
    task_id = task_definition_pb2.TaskIdentifier(project=project, domain=domain, name=driver.dapo_pipeline.name,
                                                 version=version)
    return TaskDetails(task_definition_pb2.TaskDetails(task_id=task_id, spec=flyte.extras.serialize(driver.dapo_pipeline)))


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeBackend:
    seen = FakeBackend()

    def init_from_config(path: str, **kwargs: Any) -> None:
        seen.inits.append({"path": path, **kwargs})
        flyte.init(project=kwargs.get("project"), domain=kwargs.get("domain"))  # no endpoint: nothing to reach

    def get(name: str, *, project: str, domain: str, version: str | None = None, auto_version: str | None = None):
        seen.lookups.append({"name": name, "project": project, "domain": domain, "version": version,
                             "auto_version": auto_version})

        held = deployed_driver(project, domain, DEPLOYED_VERSION)  # serialised here: the SDK forbids it in fetch

        async def fetch() -> TaskDetails:
            if (project, domain) not in DEPLOYED_IN or version not in (None, DEPLOYED_VERSION):
                raise flyte.errors.RemoteTaskNotFoundError(f"Task {name}, version {version} not found in {project} {domain}.")
            return held

        return LazyEntity(name=name, getter=fetch)

    async def submit(self: Any, **kwargs: Any) -> FakeRun:
        seen.submitted.append(kwargs)
        return FakeRun(RUN_URL)

    monkeypatch.setattr(flyte, "init_from_config", init_from_config)
    monkeypatch.setattr(flyte.remote.Task, "get", get)
    monkeypatch.setattr(flyte._run, "get_client", lambda: object())
    monkeypatch.setattr(flyte._run._Runner, "_submit_remote", submit)
    return seen


def flyte_config_file(tmp_path: Path) -> str:
    path = tmp_path / "flyte.yaml"
    path.write_text("admin:\n  endpoint: dns:///flyte.example:443\n")
    return str(path)


def decoded(proto_inputs: Any) -> dict[str, Any]:
    """The sent inputs, decoded with the types of the driver's signature."""
    types = {"run_config": RunConfig, "run_dir": str}
    return {lit.name: asyncio.run(TypeEngine.to_python_value(lit.value, types[lit.name])) for lit in proto_inputs.literals}


def test_remote_run_sends_the_loaded_config_to_the_deployed_driver(
        backend: FakeBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flyte_config = flyte_config_file(tmp_path)
    code = cli.main(["run", "--remote", "--config", str(TINY), "--set", "run.steps=3", "--set", "run.seed=5",
                     "--flyte-config", flyte_config, "--project", "ml", "--domain", "staging",
                     "--run-root", "s3://bucket/runs"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip().splitlines()[-1] == RUN_URL
    assert backend.inits == [{"path": flyte_config, "project": "ml", "domain": "staging"}]
    assert backend.lookups == [{"name": "dapo-cpu.dapo_pipeline", "project": "ml", "domain": "staging",
                                "version": None, "auto_version": "latest"}]
    (sent,) = backend.submitted
    # by reference: the registered task (its id, the newest version), not a spec uploaded from here
    assert (sent["task_id"].name, sent["task_id"].version) == ("dapo-cpu.dapo_pipeline", "v7")
    assert (sent["project_id"].name, sent["project_id"].domain) == ("ml", "staging") and sent["run_id"] is None
    config = load_config(str(TINY), ["run.steps=3", "run.seed=5"])
    assert decoded(sent["proto_inputs"]) == {"run_config": config, "run_dir": "s3://bucket/runs/tiny-cpu"}


def test_a_named_version_is_looked_up_as_given(backend: FakeBackend, tmp_path: Path) -> None:
    code = cli.main(["run", "--remote", "--flyte-config", flyte_config_file(tmp_path), "--project", "ml",
                     "--domain", "staging", "--version", "v7", "--run-root", "/runs"])
    assert code == 0
    assert backend.lookups[0]["version"] == "v7" and backend.lookups[0]["auto_version"] is None
    assert decoded(backend.submitted[0]["proto_inputs"])["run_dir"] == "/runs/tiny-cpu"  # the run store volume


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "no-such.yaml"], "no-such.yaml"),
    (["--set", "train.eps_high=0.1"], "eps_high"),
    (["--set", "run.nosuchfield=1"], "nosuchfield"),
    (["--run-root", "runs"], "--run-root runs: a cluster run needs a run store every pod reaches"),
    (["--project", "nosuch"], "--project nosuch --domain staging: no deployed dapo-cpu.dapo_pipeline"),
    (["--version", "v1"], "no deployed dapo-cpu.dapo_pipeline (version v1)"),
    (["--flyte-config", "missing.yaml"], "--flyte-config missing.yaml: no such file"),
    (["--flyte-config", ""], "--remote needs --flyte-config"),
])
def test_bad_input_is_one_line_exit_2_and_no_run_is_created(
        backend: FakeBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    base = {"--flyte-config": flyte_config_file(tmp_path), "--project": "ml", "--domain": "staging",
            "--run-root": "s3://bucket/runs"}
    given = dict(zip(args[::2], args[1::2]))
    argv = ["run", "--remote", *[item for key, value in {**base, **given}.items() if key != "--set"
                                 for item in (key, value)]]
    argv += [item for key, value in given.items() if key == "--set" for item in (key, value)]
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert backend.submitted == []
    if message.startswith(("no-such", "eps_high", "nosuchfield", "--run-root", "--flyte-config", "--remote")):
        assert backend.inits == []  # refused before the backend is contacted at all
