"""Where a run went wrong or slow, in words: one small pure rule per kind of anomaly.

Each rule takes the run's step records (StepMetrics rows as dicts, in step order) or its step
times and returns :class:`Anomaly` records the run page lists under its headline. The thresholds
are declared here once, with why; a rule that finds nothing returns an empty list.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SLOW_STEP_FACTOR = 3.0  # a step this many times the median step time is slow (a stall, a swap, a restart)
ENTROPY_COLLAPSE_FRACTION = 0.25  # entropy below this share of its early level: exploration collapsed (sec. 3.1)
EARLY_STEPS = 5  # the "early level" is the mean over the first steps that have a value
JUMP_SPREADS = 6.0  # a step-to-step change this many robust spreads (MAD of the changes) away is a jump
JUMP_MIN_STEPS = 8  # fewer steps than this give no trustworthy spread of the changes


@dataclass(frozen=True)
class Anomaly:
    """One finding: its kind, the steps it covers (first to last) and a sentence for the reader."""

    kind: str  # "slow steps", "entropy collapse", "reward jump", "length jump", "carried groups only"
    first_step: int
    last_step: int
    text: str


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ranges(steps: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive steps merged: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    out: list[tuple[int, int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _steps_text(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def slow_steps(steps: Sequence[int], seconds: Sequence[float], factor: float = SLOW_STEP_FACTOR) -> list[Anomaly]:
    """Runs of consecutive steps that took more than ``factor`` x the median step time."""
    pairs = [(s, t) for s, t in zip(steps, seconds) if _finite(t)]
    if len(pairs) < 3:
        return []
    median = statistics.median(t for _, t in pairs)
    slow = {s: t for s, t in pairs if median > 0 and t > factor * median}
    out = []
    for first, last in _ranges(list(slow)):
        worst = max(slow[s] for s in range(first, last + 1) if s in slow)
        out.append(Anomaly("slow steps", first, last,
                           f"{_steps_text(first, last)} took up to {worst:.1f} s, {worst / median:.1f}x the median "
                           f"step ({median:.1f} s)"))
    return out


def entropy_collapse(metrics: Sequence[dict[str, Any]], fraction: float = ENTROPY_COLLAPSE_FRACTION) -> list[Anomaly]:
    """The first step from which policy entropy stays below ``fraction`` of its early level (sec. 3.1)."""
    values = [(m["step"], float(m["entropy"])) for m in metrics if _finite(m.get("entropy"))]
    if len(values) < EARLY_STEPS + 1:
        return []
    early = statistics.fmean(v for _, v in values[:EARLY_STEPS])
    if early <= 0:
        return []
    below = [i for i, (_, v) in enumerate(values) if v < fraction * early]
    # the collapse starts where entropy drops below the line and never comes back above it
    start = next((i for i in below if all(v < fraction * early for _, v in values[i:])), None)
    if start is None:
        return []
    step, value = values[start]
    last_step, last = values[-1]
    return [Anomaly("entropy collapse", step, last_step,
                    f"policy entropy fell from {early:.3f} nats (first {EARLY_STEPS} steps) to {value:.3f} at step "
                    f"{step} and stayed below {fraction:.0%} of it ({last:.3f} at step {last_step}): the policy "
                    "stopped exploring (entropy collapse, DAPO sec. 3.1)")]


def jumps(metrics: Sequence[dict[str, Any]], column: str, name: str, unit: str = "",
          spreads: float = JUMP_SPREADS) -> list[Anomaly]:
    """Steps whose change of ``column`` from the step before is more than ``spreads`` robust spreads
    (median absolute deviation of all step-to-step changes) from the median change."""
    values = [(m["step"], float(m[column])) for m in metrics if _finite(m.get(column))]
    if len(values) < JUMP_MIN_STEPS:
        return []
    changes = [(values[i][0], values[i - 1][1], values[i][1]) for i in range(1, len(values))]
    deltas = [b - a for _, a, b in changes]
    centre = statistics.median(deltas)
    spread = statistics.median(abs(d - centre) for d in deltas)
    if spread <= 0:
        return []
    out = []
    for step, before, after in changes:
        if abs(after - before - centre) > spreads * spread:
            direction = "rose" if after > before else "fell"
            out.append(Anomaly(f"{name} jump", step, step,
                               f"{name} {direction} from {before:.3g}{unit} to {after:.3g}{unit} at step {step} "
                               f"({abs(after - before - centre) / spread:.0f}x the typical step-to-step change)"))
    return out


def carried_only(metrics: Sequence[dict[str, Any]]) -> list[Anomaly]:
    """Steps that generated nothing and trained only on groups carried over from earlier steps
    (0 generation rounds), so their samples came from an older policy."""
    steps = [m["step"] for m in metrics if m.get("generation_rounds") == 0 and (m.get("trained_groups") or 0) > 0]
    if not steps:
        return []
    ranges = [str(a) if a == b else f"{a}-{b}" for a, b in _ranges(steps)]
    listed = ranges[0] if len(ranges) == 1 else ", ".join(ranges[:-1]) + " and " + ranges[-1]
    return [Anomaly("carried groups only", steps[0], steps[-1],
                    f"step{'s' if len(steps) > 1 else ''} {listed} trained only on groups carried over from earlier "
                    "steps (0 generation rounds): off-policy samples, no training accuracy")]


def find_anomalies(metrics: Sequence[dict[str, Any]], step_seconds: Sequence[float]) -> list[Anomaly]:
    """Every rule over one run, in page order. ``step_seconds`` are the step times in step order
    (summary.json), aligned with the last ``len(step_seconds)`` metrics rows."""
    steps = [m["step"] for m in metrics][-len(step_seconds):] if step_seconds else []
    return [
        *slow_steps(steps, step_seconds),
        *entropy_collapse(metrics),
        *jumps(metrics, "reward_mean", "reward"),
        *jumps(metrics, "response_length_mean", "response length", " tokens"),
        *carried_only(metrics),
    ]
