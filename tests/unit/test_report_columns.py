"""The run page's steps table names its columns from the step record's declarations (schemas/models.py
StepMetrics -> schemas/step_stats.py STEP_FIELDS): a new metric needs only its declaration (and its
producer) to reach the table, labelled and formatted by its declared unit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import pandera.pyarrow as pdp
import pyarrow as pa

from reports.run import write_report
from schemas.models import StepMetrics, _stat
from schemas.step_stats import STEP_FIELDS, step_fields
from tests.report_data import run_data


def _headers(page: str) -> list[str]:
    table = page[page.index("<table id='steps"):]
    table = table[:table.index("</thead>")]
    return re.findall(r"<th[^>]*>([^<]*)</th>", table)


def test_every_statistic_of_the_step_record_is_a_column(tmp_path: Path) -> None:
    data = run_data(6)
    page, _ = write_report(tmp_path, title="run", **data)
    headers = _headers(page.read_text())
    for field in STEP_FIELDS:
        if field.by != "key":
            assert field.name.replace("_", " ") in headers, f"StepMetrics.{field.name} has no column in the steps table"


class _WithNewMetric(StepMetrics):
    """StepMetrics plus one statistic, declared as a contributor would add it."""

    reward_hacking_fraction: Optional[pa.float64()] = pdp.Field(nullable=True, metadata=_stat("rollout", "driver", "fraction"))
    """Fraction of samples flagged by a (made-up) reward-hacking detector."""


def test_a_new_metric_reaches_the_table_by_its_declaration_alone() -> None:
    from reports.run import steps_table

    fields = step_fields(_WithNewMetric)
    rows = [{**{f.name: f.blank for f in fields}, "step": 1, "reward_hacking_fraction": 0.125}]
    html = steps_table(rows, fields)
    assert "reward hacking fraction" in html
    assert "<td>12.5%</td>" in html  # declared a fraction: shown in percent
    assert "rollout" in html  # under its tracker group's heading


def test_samples_mix_outcomes_from_several_steps() -> None:
    from reports.run import outcome_tags, pick_samples

    rows = run_data(9)["samples"]  # steps 3, 6, 9; each: right, wrong, truncated, penalised, hedged
    assert outcome_tags(rows[2]) == ("wrong", "truncated", "penalised")
    assert outcome_tags(rows[4]) == ("wrong", "hedged")
    picked = pick_samples(rows, count=8)
    tags = {t for r in picked for t in outcome_tags(r)}
    assert tags == {"right", "wrong", "truncated", "penalised", "hedged"}
    assert {r["step"] for r in picked} == {3, 6, 9}
    assert [r["step"] for r in picked] == sorted(r["step"] for r in picked)
    # four correct answers of one step (the old page's choice) are still shown, but only as many as there are
    assert len(pick_samples([{"step": 1, "correct": True}] * 3, count=8)) == 3


def test_past_100_steps_earlier_blocks_are_summarised(tmp_path: Path) -> None:
    data = run_data(250)
    page, _ = write_report(tmp_path, title="run", **data)
    text = page.read_text()
    latest = text[text.index("<table id='steps-latest'"):]
    latest = latest[:latest.index("</table>")]
    assert latest.count("<tr>") == 2 + 50  # two heading rows, steps 201-250
    blocks = text[text.index("<table id='steps-blocks'"):]
    blocks = blocks[:blocks.index("</table>")]
    assert "<td>1-100</td>" in blocks and "<td>101-200</td>" in blocks
    mean_loss = sum(m["loss"] for m in data["metrics"][:100]) / 100
    assert f"<td>{mean_loss:.4g}</td>" in blocks
