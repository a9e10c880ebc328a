"""`dapo lineage` and `dapo audit` on a small finished run built from shards (tests/lineage_run.py):
every shard a checkpoint's batch came from, carried surplus included; problem-level lineage; the
SQL views over the run's shards; bad input in one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.lineage import checkpoint_lineage
from cli.main import main
from storage.run_layout import RunLayout
from tests import lineage_run

CARRIED_FROM = "steps/step-0001/scored/round-00.parquet"  # step 2 trained on group D from here (surplus)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(lineage_run.build(tmp_path_factory.mktemp("lineage") / "run").root)


def _dapo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_checkpoint_json_lists_every_shard_its_batch_came_from_carried_ones_included(run: Path) -> None:
    record = checkpoint_lineage(RunLayout(run), "2")
    step_2 = json.dumps(record["ancestry"][0])  # step 1's own entry names its shards too: look at step 2's
    assert CARRIED_FROM in step_2, "the carried surplus' scored shard is missing from step 2's batch record"
    sources = {Path(s["shard"]).relative_to(run).as_posix(): (s["samples"], s["carried"])
               for s in record["ancestry"][0]["batch"]["sources"]}
    assert sources == {CARRIED_FROM: (4, True), "steps/step-0002/scored/round-00.parquet": (4, False)}


def test_checkpoint_text_is_a_short_chain_naming_each_batch_shard(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _dapo(capsys, "lineage", str(run), "--checkpoint", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) < 20, out
    assert lines[0].startswith(f"checkpoint  {lineage_run.checkpoint_id(2)}  step 2")
    assert f"parent      {lineage_run.checkpoint_id(1)}  step 1" in lines
    assert "4 of 8 samples from steps/step-0002/scored/round-00.parquet" in out
    assert f"4 of 8 samples carried from {CARRIED_FROM}" in out
    assert "3 checkpoints back to step 0" in out


def test_checkpoint_text_stays_short_however_long_the_ancestry(run: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.lineage

    monkeypatch.setattr(cli.lineage, "ANCESTORS_SHOWN", 1)
    code, out, _ = _dapo(capsys, "lineage", str(run), "--checkpoint", lineage_run.checkpoint_id(3))
    assert code == 0
    assert "... 2 more (--json lists every one)" in out
    assert f"step 0  {lineage_run.checkpoint_id(0)}  made by import" in out


def test_problem_lists_every_sample_with_its_step_round_reward_and_training(run: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _dapo(capsys, "lineage", str(run), "--problem", lineage_run.problem_id("A"), "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["problem"]["problem"] == "A?" and record["problem"]["split"] == "train"
    # A: 4 samples at step 1 (trained at 1), 4 at step 2 round 1 (all correct: dropped), 4 at step 3 (trained at 3)
    got = [(s["step"], s["round"], s["sample_index"], s["reward"], s["trained_step"]) for s in record["samples"]]
    expected = [(step, rnd, i, 1.0 if i < correct else -1.0, trained)
                for step, rnd, correct, trained in ((1, 0, 3, 1), (2, 1, 4, None), (3, 0, 3, 3)) for i in range(4)]
    assert got == expected
    code, out, _ = _dapo(capsys, "lineage", str(run), "--problem", lineage_run.problem_id("A"))
    assert code == 0
    assert "samples  12 in 3 steps, 8 trained on (6 of them correct)" in out
    assert "(12 rows)" in out


def test_audit_views_cover_every_shard_without_copying(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _dapo(capsys, "audit", str(run), "--views")
    assert code == 0
    for view in ("samples", "batches", "surplus", "problems", "rejected", "steps", "checkpoints", "eval"):
        assert f"\n{view}: " in f"\n{out}", view
    code, out, _ = _dapo(capsys, "audit", str(run), "--json", "--sql",
                         "SELECT (SELECT count(*) FROM samples) AS samples, (SELECT count(*) FROM batches) AS trained, "
                         "(SELECT count(*) FROM problems) AS problems, (SELECT count(*) FROM checkpoints) AS checkpoints, "
                         "(SELECT count(*) FROM steps) AS steps, (SELECT count(*) FROM eval) AS eval, "
                         "(SELECT count(*) FROM surplus) AS surplus")
    assert code == 0
    # scored: step 1 four groups, step 2 two + one, step 3 two (x G=4); batches: 2 groups a step
    assert json.loads(out)["rows"] == [{"samples": 36, "trained": 24, "problems": 8, "checkpoints": 4, "steps": 3,
                                        "eval": 4, "surplus": 4}]


def test_batches_name_the_source_shard_of_every_trained_sample(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _dapo(capsys, "audit", str(run), "--json", "--sql",
                         "SELECT step, source_shard, carried, count(*) AS n FROM batches GROUP BY ALL ORDER BY ALL")
    assert code == 0
    rows = [(r["step"], r["source_shard"], r["carried"], r["n"]) for r in json.loads(out)["rows"]]
    assert rows == [(1, "steps/step-0001/scored/round-00.parquet", False, 8), (2, CARRIED_FROM, True, 4),
                    (2, "steps/step-0002/scored/round-00.parquet", False, 4),
                    (3, "steps/step-0003/scored/round-00.parquet", False, 8)]


def test_audit_prints_a_readable_table(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _dapo(capsys, "audit", str(run), "--sql",
                         "SELECT step, checkpoint_id, parent_checkpoint_id, loss FROM checkpoints ORDER BY step")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["step", "checkpoint_id", "parent_checkpoint_id", "loss"]
    assert lines[2].split() == ["0", lineage_run.checkpoint_id(0), "null", "null"]
    assert lines[-1] == "(4 rows)"


@pytest.mark.parametrize("argv, message", [
    (["audit", "{missing}", "--views"], "not a run folder"),
    (["audit", "{run}", "--sql", "SELEC 1"], "Parser Error"),
    (["audit", "{run}", "--sql", "SELECT nope FROM samples"], 'column "nope" not found'),
    (["audit", "{run}", "--sql", "SELECT * FROM no_such_view"], "no_such_view"),
    (["lineage", "{run}", "--problem", "0123456789abcdef"], "no problem '0123456789abcdef'"),
    (["lineage", "{run}", "--checkpoint", "9"], "no checkpoint '9'"),
], ids=["no-run", "syntax", "column", "view", "problem", "checkpoint"])
def test_bad_input_is_one_line_and_exit_code_2(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               argv: list[str], message: str) -> None:
    argv = [a.format(run=run, missing=tmp_path / "missing") for a in argv]
    code, out, err = _dapo(capsys, *argv)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err, err


def test_the_view_patterns_match_what_the_run_layout_names(tmp_path: Path) -> None:
    import fnmatch

    from storage import run_views
    from storage.run_layout import RunLayout

    layout = RunLayout(tmp_path)

    def relative(path: str) -> str:
        return Path(path).relative_to(tmp_path).as_posix()

    named = {"scored": layout.scored_shard(12, 3), "batch": layout.batch_shard(12), "surplus": layout.surplus_shard(12),
             "metrics": layout.metrics_shard(12), "eval": layout.eval_shard(12),
             "problems": f"{layout.problems_dir}/train-00000.parquet", "rejected": f"{layout.rejected_dir}/part-00000.parquet"}
    assert set(named) == set(run_views.SHARD_KINDS)
    for name, path in named.items():
        assert fnmatch.fnmatch(relative(path), run_views.SHARD_KINDS[name].pattern), name
    assert fnmatch.fnmatch(relative(f"{layout.checkpoint(12)}/dapo_checkpoint.json"), run_views.CHECKPOINT_RECORDS)


def test_a_run_without_steps_has_every_view_empty_with_its_columns(tmp_path: Path) -> None:
    from storage import run_views

    (tmp_path / "run.json").write_text("{}")
    con = run_views.open_run(tmp_path)
    for view in run_views.describe(con):
        assert view.columns, view.name
        assert con.execute(f"SELECT count(*) FROM {view.name}").fetchone() == (0,), view.name
    assert {c.name for c in run_views.describe(con)[0].columns} >= {"step", "round", "problem_id", "reward", "shard"}


def test_hidden_temp_files_and_staging_folders_are_not_read(tmp_path: Path) -> None:
    from storage import run_views

    layout = lineage_run.build(tmp_path / "run")
    scored = Path(layout.scored_shard(1, 0))
    (scored.parent / f".{scored.name}.abc123.tmp").write_bytes(b"half a shard")  # schemas.write_shard's temp name
    staging = Path(layout.checkpoints_dir) / ".step-0004.staging-1-abcd"  # storage/checkpoints.py: staging_dir
    staging.mkdir()
    (staging / "dapo_checkpoint.json").write_text('{"checkpoint_id": "half", "step": 4}')
    con = run_views.open_run(layout.root)
    assert con.execute("SELECT count(*) FROM samples").fetchone() == (36,)
    assert con.execute("SELECT max(step) FROM checkpoints").fetchone() == (3,)


def test_a_damaged_shard_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = lineage_run.build(tmp_path / "run")
    Path(layout.batch_shard(2)).write_bytes(b"not parquet")
    for argv in (["audit", layout.root, "--sql", "SELECT count(*) FROM batches"],
                 ["lineage", layout.root, "--checkpoint", "3"]):
        code, out, err = _dapo(capsys, *argv)
        assert code == 2 and out == "", argv
        assert len(err.strip().splitlines()) == 1 and "steps/step-0002/batch.parquet" in err, err


def test_every_model_with_added_columns_is_read_by_column_name() -> None:
    import schemas
    from storage import run_views

    for name, kind in run_views.SHARD_KINDS.items():
        assert kind.columns_vary == (kind.model in schemas.models.ADDED_COLUMNS), name


def test_metrics_of_older_code_without_an_added_column_read_as_null(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    import schemas
    from storage import run_views

    layout = lineage_run.build(tmp_path / "run")
    added = schemas.models.ADDED_COLUMNS["StepMetrics"]
    old = pq.read_table(layout.metrics_shard(1))
    pq.write_table(old.drop_columns(list(added)), layout.metrics_shard(1))  # as an earlier version wrote it
    con = run_views.open_run(layout.root)
    rows = con.execute(f"SELECT step, {added[0]} FROM steps ORDER BY step").fetchall()
    assert [step for step, _ in rows] == [1, 2, 3] and rows[0][1] is None


def test_checkpoints_view_marks_what_retention_pruned(tmp_path: Path) -> None:
    from storage import run_views

    layout = lineage_run.build(tmp_path / "run")
    Path(f"{layout.checkpoint(1)}.pruned.json").write_text('{"files": {}}')  # storage/pruning.py writes it beside
    con = run_views.open_run(layout.root)
    assert con.execute("SELECT step, folder, pruned FROM checkpoints ORDER BY step").fetchall() == [
        (0, "checkpoints/step-0000", False), (1, "checkpoints/step-0001", True), (2, "checkpoints/step-0002", False),
        (3, "checkpoints/step-0003", False)]


def test_a_run_in_an_object_store_is_queried_from_its_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import uuid

    from storage import run_store

    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    uri = f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}"
    run_store.upload_folder(lineage_run.build(tmp_path / "run").root, uri, marker=None)
    code, out, err = _dapo(capsys, "audit", uri, "--json", "--sql",
                           "SELECT step, source_shard, count(*) AS n FROM batches WHERE carried GROUP BY ALL")
    assert code == 0, err
    assert json.loads(out)["rows"] == [{"step": 2, "source_shard": CARRIED_FROM, "n": 4}]
    code, out, err = _dapo(capsys, "lineage", uri, "--checkpoint", "2")
    assert code == 0, err
    assert f"4 of 8 samples carried from {CARRIED_FROM}" in out
    code, out, err = _dapo(capsys, "lineage", uri, "--step", "2", "--json")
    assert code == 0, err
    assert {s["rollout_id"] for s in json.loads(out)["samples"]} == {
        lineage_run.rollout_id(step, rnd, name, i) for step, rnd, name in lineage_run.TRAINED[2] for i in range(4)}
    code, _, err = _dapo(capsys, "audit", f"{uri}-missing", "--views")
    assert code == 2 and f"'{uri}-missing': not a run folder" in err


def test_an_audit_query_loads_neither_torch_nor_pandera(run: Path) -> None:
    # About a second a query (issue 48) leaves no room for torch (~2 s, once imported by cli/main.py for
    # workflows.config's ConfigError) or the pandera models (~1 s, through storage.run_store): the views
    # need neither. Checked by what is imported, not by a timing.
    import subprocess
    import sys

    code = ("import sys; from cli.main import main; "
            f"main(['audit', {str(run)!r}, '--sql', 'SELECT count(*) FROM batches']); "
            "print(sorted(m for m in ('torch', 'pandera', 'pandas', 'flyte') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


def _table(text: str) -> list[dict[str, str]]:
    """The rows of the table that ends ``text`` (as cli/audit.py: as_table prints one), by column name."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["rollout_id"])
    names = lines[header].split()
    return [dict(zip(names, line.split(), strict=True)) for line in lines[header + 2:-1]]


def test_step_names_what_each_trained_sample_is(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Bare rollout ids say nothing; like --checkpoint and --problem, --step names the checkpoint the step
    # trained and produced, the shards its batch came from, and for each sample its problem, the step,
    # round and checkpoint that generated it, whether it was carried, and its reward.
    code, out, err = _dapo(capsys, "lineage", str(run), "--step", "2")
    assert code == 0, err
    head = out.splitlines()[0]
    assert head.startswith("step") and " 2 " in f"{head} " and lineage_run.checkpoint_id(1) in head, head
    assert f"into {lineage_run.checkpoint_id(2)}" in head, head
    assert "batch       steps/step-0002/batch.parquet: 8 samples of 2 problems" in out
    assert f"4 of 8 samples carried from {CARRIED_FROM}" in out
    rows = {row["rollout_id"]: row for row in _table(out)}
    expected = {lineage_run.rollout_id(step, rnd, name, i): (step, rnd, name, i)
                for step, rnd, name in lineage_run.TRAINED[2] for i in range(lineage_run.G)}
    assert set(rows) == set(expected)
    for rollout_id, (step, rnd, name, i) in expected.items():
        row = rows[rollout_id]
        assert row["problem_id"] == lineage_run.problem_id(name)
        assert (row["source_step"], row["source_round"], row["carried"]) == (str(step), str(rnd), str(step < 2).lower())
        assert row["generated_by"] == lineage_run.checkpoint_id(step - 1)
        assert row["reward"] == ("1" if i < 3 else "-1")
    assert out.splitlines()[-1] == "(8 rows)"


def test_step_json_is_the_full_record(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _dapo(capsys, "lineage", str(run), "--step", "2", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["checkpoint"]["checkpoint_id"] == lineage_run.checkpoint_id(2)
    assert record["checkpoint"]["parent_checkpoint_id"] == lineage_run.checkpoint_id(1)
    assert record["batch"]["shard"] == "steps/step-0002/batch.parquet" and record["batch"]["samples"] == 8
    carried = [s for s in record["samples"] if s["carried"]]
    assert len(carried) == 4 and {s["source_shard"] for s in carried} == {CARRIED_FROM}
    assert {s["generated_by"] for s in carried} == {lineage_run.checkpoint_id(0)}


def test_a_step_that_trained_nothing_is_one_line_and_exit_code_2(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _dapo(capsys, "lineage", str(run), "--step", "9")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "step 9" in err and "steps/step-0009/batch.parquet" in err, err
