"""workflows/local_flyte.py: a local Flyte call keeps its folders where it is told, not in /tmp/flyte.

Local Flyte writes every run's action folders under a hard-coded /tmp/flyte/metadata (``TMPDIR``
does not move it) and never removes them: ~600 folders a 150-step ``dapo run``.
"""

from __future__ import annotations

from pathlib import Path

import flyte
import flyte.report

from workflows.local_flyte import remove_empty_folders, run_local

FLYTE_TMP = Path("/tmp/flyte")
env = flyte.TaskEnvironment(name="local-flyte-probe")


@env.task
async def child(x: int) -> int:
    return x + 1


@env.task(report=True)
async def parent(x: int) -> int:
    await flyte.report.replace.aio("<p>probe page</p>", do_flush=True)
    return await child(x) + await child(x + 10)


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def test_a_call_keeps_its_folders_where_it_is_told_and_only_what_holds_something(tmp_path: Path) -> None:
    flyte.init()
    before = {sub: _entries(FLYTE_TMP / sub) for sub in ("metadata", "raw_data")}
    assert run_local(parent, {"x": 1}, raw_data=tmp_path / "raw", actions=tmp_path / "actions") == 14
    # Nothing of this call in Flyte's default folders (no other test calls Flyte with its defaults).
    assert {sub: _entries(FLYTE_TMP / sub) for sub in before} == before
    # Its action folders are under `actions`: the parent's report page stays, the empty ones are gone.
    pages = list((tmp_path / "actions").rglob("report.html"))
    assert len(pages) == 1 and "probe page" in pages[0].read_text()
    assert [p for p in (tmp_path / "actions").rglob("*") if p.is_dir() and not any(p.iterdir())] == []


def test_empty_folders_go_deepest_first_and_the_root_and_any_file_stay(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "keep.html").write_text("x")
    remove_empty_folders(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["d", "d/keep.html"]
    remove_empty_folders(tmp_path / "d" / "missing")  # nothing there: nothing to do
