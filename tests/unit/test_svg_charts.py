"""The report's SVG charts: well-formed, inside their frame, gaps where values are missing, honest ticks."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from reports.svg_charts import (
    HEIGHT_PX,
    WIDTH_PX,
    Series,
    chart,
    integer_ticks,
    nice_ticks,
)

NS = "{http://www.w3.org/2000/svg}"


def _numbers(svg: str) -> list[float]:
    root = ET.fromstring(svg)
    out: list[float] = []
    for el in root.iter():
        for key in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "width", "height"):
            if key in el.attrib:
                out.append(float(el.attrib[key]))
        if "points" in el.attrib:
            out += [float(v) for pair in el.attrib["points"].split() for v in pair.split(",")]
    return out


def test_a_missing_value_splits_the_line_and_draws_no_point() -> None:
    svg = chart("t", [1, 2, 3, 4, 5], [Series("acc", [0.1, 0.2, None, 0.4, 0.5])], y_label="y")
    root = ET.fromstring(svg)
    assert len(root.findall(f"{NS}polyline")) == 2  # 1-2 and 4-5, nothing drawn across step 3
    assert len(root.findall(f"{NS}circle")) == 4


def test_shaded_steps_and_legend_name_the_gap() -> None:
    svg = chart("t", [1, 2, 3], [Series("acc", [0.1, None, 0.3])], y_label="y", shaded_steps=[2],
                shaded_label="0 generation rounds")
    assert "0 generation rounds" in svg and "fill-opacity='0.3'" in svg


def test_stacked_bars_reach_the_sum() -> None:
    svg = chart("t", [1], [Series("a", [2.0], kind="bar"), Series("b", [3.0], kind="bar")], y_label="s")
    rects = [r for r in ET.fromstring(svg).findall(f"{NS}rect") if r.attrib.get("fill") in ("#4c72b0", "#dd8452")]
    a, b = [r for r in rects if float(r.attrib["width"]) != 18]  # 18 px: legend swatches
    assert math.isclose(float(b.attrib["height"]) / float(a.attrib["height"]), 1.5, rel_tol=0.02)
    # b stands on a (SVG's y grows downwards): b's bottom edge is a's top edge, so the stack reaches 2 + 3.
    assert math.isclose(float(b.attrib["y"]) + float(b.attrib["height"]), float(a.attrib["y"]), abs_tol=0.01)


def test_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 100.0) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.213, 0.587)[0] <= 0.213 and nice_ticks(0.213, 0.587)[-1] >= 0.587
    assert integer_ticks(1, 20) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert integer_ticks(0, 1000) == [0, 200, 400, 600, 800, 1000]


# allow_subnormal=False: the suite flushes denormals (torch.set_flush_denormal), a global FPU state.
values = st.one_of(st.none(), st.just(float("nan")), st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 40),
    data=st.data(),
    percent=st.booleans(),
    kind=st.sampled_from(["line", "dashed", "bar"]),
)
def test_any_series_gives_well_formed_svg_inside_the_frame(n: int, data: st.DataObject, percent: bool, kind: str) -> None:
    steps = sorted(data.draw(st.sets(st.integers(0, 5000), min_size=n, max_size=n)))
    ys = data.draw(st.lists(values, min_size=n, max_size=n))
    err = data.draw(st.lists(st.one_of(st.none(), st.floats(0, 1e3, allow_subnormal=False)), min_size=n, max_size=n))
    svg = chart("title <&>", steps, [Series("s", ys, kind=kind, yerr=err if kind == "line" else None),
                                      Series("r", ys, right=True)], y_label="y", percent=percent)
    assert not re.search(r"\b(nan|inf)\b", svg)
    for v in _numbers(svg):
        assert -5 <= v <= max(WIDTH_PX, HEIGHT_PX) + 5, v


def _tick_labels(svg: str) -> list[str]:
    import re

    return re.findall(r"text-anchor='end'>([^<]*)</text>", svg)


def test_axes_of_fractions_never_run_below_zero() -> None:
    # clip fractions near 0 (the issue: "-0%" ticks under a truncation/clip chart)
    svg = chart("clip", [1, 2, 3, 4], [Series("low", [0.0, 0.12, 0.05, 0.31]), Series("high", [0.0, 0.0, 0.01, 0.02])],
                y_label="%", percent=True)
    labels = _tick_labels(svg)
    assert labels and not any(label.startswith("-") for label in labels), labels
    # a series that stays at 0 (no truncation at all, a step without a value) got -0.6% .. -0% ticks
    for values in ([0.4, 0.5, 0.45], [0.0, 0.0, 0.0], [None, 0.0, 0.0]):
        labels = _tick_labels(chart("trunc", [1, 2, 3], [Series("t", values)], y_label="%", percent=True))
        assert labels[0] == "0%" or values[0] == 0.4, (values, labels)
        assert not any(label.startswith("-") for label in labels), (values, labels)
    # the right-hand axis too (a learning rate held at 0)
    svg = chart("opt", [1, 2, 3], [Series("g", [1.0, 2.0, 1.5]), Series("lr", [0.0, 0.0, 0.0], right=True)], y_label="g")
    assert not re.findall(r"fill='#[0-9a-f]+'>-", svg), "a negative tick on the right-hand axis"
