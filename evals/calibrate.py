"""Choose each tier's threshold on a calibration split; report it on the held-out split.

The split is fixed by a seed and decided per item id (a hash), so it does not depend on the
order or number of items, and an item is on the same side in every run that holds it.
Thresholds are chosen from the calibration items' scores and outcomes alone; the held-out
items are only ever evaluated, once, with the chosen thresholds.

Targets:

- ``min-accuracy=A``: the cheapest thresholds whose accuracy is at least A;
- ``min-pgr=G``: the same, with A set to recover the fraction G of the gap between the first and
  the top tier's accuracy (on the calibration split);
- ``min-relative=R``: the same, with A the fraction R of the top tier's accuracy (on the
  calibration split): "95% of the top tier's quality" is ``min-relative=0.95``;
- ``max-cost=C``: the most accurate thresholds costing at most C dollars per 1k requests;
- ``max-escalation=E``: the most accurate thresholds escalating at most the fraction E.

When no threshold meets the target on the calibration split, the nearest miss is taken (the most
accurate, or the cheapest, or the least escalating) and the result says so.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evals.sweep import (
    CascadePolicy,
    PolicyResult,
    PreRoutePolicy,
    ResultTable,
    accuracy_of,
    cascade_arrays,
    evaluate,
    evaluate_cascades,
    evaluate_settings,
)
from router.errors import ConfigError

TARGET_KINDS = ("min-accuracy", "min-pgr", "min-relative", "max-cost", "max-escalation")
ACCURACY_KINDS = ("min-accuracy", "min-pgr", "min-relative")  # the targets that bound accuracy


@dataclass(frozen=True)
class Target:
    kind: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        kind, sep, raw = text.partition("=")
        kind = kind.strip()
        if not sep or kind not in TARGET_KINDS:
            raise ConfigError(f"target {text!r}: expected KIND=VALUE with KIND one of {', '.join(TARGET_KINDS)}")
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"target {text!r}: {raw!r} is not a number") from None
        if kind != "max-cost" and not 0 <= value <= 1.5:
            raise ConfigError(f"target {text!r}: {kind} is a fraction (0.9, not 90)")
        return cls(kind, value)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def in_calibration(item_id: str, seed: int, fraction: float) -> bool:
    h = hashlib.sha256(f"{seed}\x1f{item_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


def split(table: ResultTable, seed: int = 0, fraction: float = 0.5) -> tuple[ResultTable, ResultTable]:
    """(calibration, held-out), fixed by seed, per item id."""
    if not 0 < fraction < 1:
        raise ConfigError("the calibration fraction must be between 0 and 1")
    calib = [it.id for it in table.items if in_calibration(it.id, seed, fraction)]
    held = [it.id for it in table.items if not in_calibration(it.id, seed, fraction)]
    if not calib or not held:
        raise ConfigError(f"run {table.run}: {len(table.items)} items are too few to split for calibration")
    return table.subset(calib), table.subset(held)


MAX_POINTS = 101  # candidate thresholds per tier: a 4x finer grid moves no committed headline by a point


def candidate_values(scores: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Each distinct score (NaN, an abstention, ignored), clamped to [0, 1], with 0 and 1 (or
    `max_points` quantiles of them, 0 and 1 kept): the values a config's `threshold` can take, in
    order. Every distinct routing of these items is one of them until there are more than
    `max_points`."""
    present = np.asarray(scores, dtype=float)
    present = present[~np.isnan(present)]
    values = np.unique(np.concatenate([np.clip(present, 0.0, 1.0), [0.0, 1.0]]))
    if len(values) > max_points:
        idx = np.unique(np.round(np.arange(max_points) * (len(values) - 1) / (max_points - 1)).astype(int))
        values = values[idx]
    return values


def candidate_thresholds(table: ResultTable, verifier: str, tier: int, max_points: int) -> list[float]:
    """`candidate_values` of one tier's scores on these items, as a list."""
    scored = [it.tiers[tier].scores[verifier] for it in table.items]
    return [float(v) for v in candidate_values(np.array([math.nan if v is None else v for v in scored]), max_points)]


def setting_grid(grids: Sequence[np.ndarray]) -> np.ndarray:
    """Every combination of one candidate per tier, settings x tiers, in `itertools.product`'s
    order (the first tier's threshold varies slowest)."""
    if not grids:
        return np.zeros((1, 0))
    mesh = np.meshgrid(*grids, indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=1)


def pick_setting(
    accuracy: np.ndarray,
    cost_per_1k: np.ndarray,
    escalation: np.ndarray,
    settings: np.ndarray,
    target: Target,
    goal: float,
) -> tuple[int, bool]:
    """The rule that chooses a setting for a target, over arrays (one entry per candidate setting):
    the index of the chosen setting, and whether it meets the target. Among the settings that meet
    it: for an accuracy target the cheapest (then the most accurate), for the other kinds the most
    accurate (then the cheapest). When none meets it, the nearest miss: the most accurate (an
    accuracy target), the cheapest (`max-cost`) or the least escalating (`max-escalation`). Ties go
    to the lowest thresholds, the first tier's first. `choose`, `eval calibrate`, the reports and
    the split study (`evals.splits`) all choose with this one function."""
    meets = _meets_arrays(accuracy, cost_per_1k, escalation, target, goal)
    feasible = bool(meets.any())
    pool = np.flatnonzero(meets) if feasible else np.arange(len(accuracy))
    if target.kind in ACCURACY_KINDS:
        first, second = (cost_per_1k, -accuracy) if feasible else (-accuracy, cost_per_1k)
    elif feasible:
        first, second = -accuracy, cost_per_1k
    elif target.kind == "max-cost":
        first, second = cost_per_1k, -accuracy
    else:
        first, second = escalation, -accuracy
    ties = [settings[pool, j] for j in reversed(range(settings.shape[1]))]
    order = np.lexsort([*ties, second[pool], first[pool]])  # the last key sorts first
    return int(pool[order[0]]), feasible


def _meets_arrays(
    accuracy: np.ndarray, cost_per_1k: np.ndarray, escalation: np.ndarray, target: Target, goal: float
) -> np.ndarray:
    """`_meets`, setting by setting."""
    if target.kind in ACCURACY_KINDS:
        return np.asarray(accuracy >= goal - 1e-12)
    if target.kind == "max-cost":
        return np.asarray(cost_per_1k <= goal + 1e-12)
    return np.asarray(escalation <= goal + 1e-12)


@dataclass(frozen=True)
class Calibration:
    verifier: str
    target: Target
    seed: int
    fraction: float
    thresholds: dict[str, float]  # tier name -> threshold (every tier but the last)
    met: bool  # the target was reachable on the calibration split
    calibration: PolicyResult
    held_out: PolicyResult
    held_out_tiers: list[PolicyResult]  # each single tier on the held-out items, for comparison
    n_calibration: int
    n_held_out: int

    @property
    def held_out_met(self) -> bool:
        return _meets(self.held_out, self.target, self.held_out_goal)

    @property
    def held_out_goal(self) -> float:
        """What the target asks of the cascade on the held-out items (an accuracy for the accuracy
        kinds, a cost or an escalation rate for the others)."""
        return goal(self.target, self.held_out_tiers[0].accuracy, self.held_out_tiers[-1].accuracy)


def _meets(r: PolicyResult, target: Target, goal: float) -> bool:
    if target.kind in ACCURACY_KINDS:
        return r.accuracy >= goal - 1e-12
    if target.kind == "max-cost":
        return r.cost_per_1k <= goal + 1e-12
    return r.escalation_rate <= goal + 1e-12


def choose(
    table: ResultTable, verifier: str, target: Target, *, max_points: int = MAX_POINTS
) -> tuple[tuple[float, ...], PolicyResult, bool]:
    """The thresholds (one per tier but the last) that best meet `target` on `table`: every
    combination of `max_points` candidates per tier (`candidate_values`), weighed through the
    decision rule's table form (`evaluate_settings`) and chosen by `pick_setting`."""
    if verifier not in table.verifiers:
        raise ConfigError(f"run {table.run}: no '{verifier}' scores on every item; have: {', '.join(table.verifiers)}")
    arrays = cascade_arrays(table, verifier)
    if table.top == 0:  # one tier: its threshold decides nothing, but a config still gets one
        grids = [np.array(candidate_thresholds(table, verifier, 0, max_points))]
    else:
        grids = [candidate_values(arrays.scores[:, t], max_points) for t in range(table.top)]
    settings = setting_grid(grids)
    weighed = evaluate_settings(arrays, settings[:, : table.top])  # the cost summed exactly: `weigh_settings`
    index, met = pick_setting(
        weighed.accuracy, weighed.cost_per_1k, weighed.escalation, settings, target, _goal(table, target)
    )
    ths = tuple(float(x) for x in settings[index])
    return ths, evaluate_cascades(table, verifier, [(ths, ths[0])])[0], met


def goal(target: Target, weak: float, strong: float) -> float:
    """The bound a target sets, given the first and the top tier's accuracy on the same items:
    `min-pgr=G` asks for weak + G * (strong - weak), `min-relative=R` for R * strong; every other
    kind states its bound itself."""
    if target.kind == "min-pgr":
        return weak + target.value * (strong - weak)
    if target.kind == "min-relative":
        return target.value * strong
    return target.value


def _goal(table: ResultTable, target: Target) -> float:
    return goal(target, accuracy_of(table, 0), accuracy_of(table, table.top))


def _pick(
    table: ResultTable, results: list[tuple[tuple[float, ...], PolicyResult]], target: Target
) -> tuple[tuple[float, ...], PolicyResult, bool]:
    """The setting that best meets `target` among `results` (each a setting and its outcome), by
    `pick_setting`."""
    settings = np.array([ths for ths, _ in results], dtype=float).reshape(len(results), -1)
    index, met = pick_setting(
        np.array([r.accuracy for _, r in results]),
        np.array([r.cost_per_1k for _, r in results]),
        np.array([r.escalation_rate for _, r in results]),
        settings,
        target,
        _goal(table, target),
    )
    ths, best = results[index]
    return ths, best, met


def calibrate(
    table: ResultTable, verifier: str, target: Target, *, seed: int = 0, fraction: float = 0.5
) -> Calibration:
    """Choose on the calibration split, evaluate once on the held-out split."""
    from evals.sweep import SingleTier

    calib, held = split(table, seed, fraction)
    ths, on_calib, met = choose(calib, verifier, target)
    names = [t.name for t in table.tiers[: max(1, table.top)]]
    return Calibration(
        verifier=verifier,
        target=target,
        seed=seed,
        fraction=fraction,
        thresholds=dict(zip(names, ths, strict=True)),
        met=met,
        calibration=on_calib,
        held_out=evaluate(CascadePolicy(verifier, ths), held, ths[0]),
        held_out_tiers=[evaluate(SingleTier(i, t.name), held) for i, t in enumerate(table.tiers)],
        n_calibration=len(calib.items),
        n_held_out=len(held.items),
    )


@dataclass(frozen=True)
class PreRouteCalibration:
    """A pre-router's skip thresholds chosen on the calibration split, reported on held-out items.

    Pre-route only: the skip thresholds that best meet the target, as for a verifier.
    Pre-route then verify: the pre-router put in front of verify-only. The verifier keeps the
    thresholds verify-only calibration chooses for the target (`reference`); the skip thresholds
    are the cheapest whose calibration accuracy is at most `max_drop` below verify-only's.
    Skipping a tier saves its generation and verification but sends the item to a dearer tier.

    Why not choose skip and verifier thresholds together: searching thousands of pairs on a
    hundred calibration items picks the pair whose calibration accuracy is luckiest. On the
    committed GSM8K and HumanEval runs (splits 1 to 6, pooled estimators) the joint choice fell
    more than a point short of verify-only on held-out items in 8 of 12 cases (by up to 8
    points); one skip threshold per tier did so once, by 0.08 points beyond."""

    policy: str
    target: Target
    skip_below: dict[str, float]  # tier name -> pre-router threshold (every tier but the last)
    thresholds: dict[str, float]  # tier name -> verifier threshold (empty for pre-route only)
    met: bool
    calibration: PolicyResult
    held_out: PolicyResult
    reference_calibration: PolicyResult | None
    reference_held_out: PolicyResult | None
    n_held_out: int
    skip_rate: float  # held-out items whose first tier was skipped before generating

    @property
    def accuracy_drop(self) -> float | None:
        """Held-out accuracy lost against verify-only at the same verifier thresholds."""
        if self.reference_held_out is None:
            return None
        return self.reference_held_out.accuracy - self.held_out.accuracy


def calibrate_preroute(
    table: ResultTable,
    prerouter: str,
    target: Target,
    *,
    verifier: str | None = None,
    seed: int = 0,
    fraction: float = 0.5,
    max_drop: float = 0.01,
    max_points: int = 21,
    reference: Calibration | None = None,
) -> PreRouteCalibration:
    """Choose the pre-router's skip thresholds (and, with a verifier, the verifier's) on the
    calibration split; evaluate once on the held-out split. `reference` is the verifier's own
    calibration for the same target and split, when the caller has already made it."""
    calib, held = split(table, seed, fraction)
    k = max(1, table.top)
    per_tier = max_points if k == 1 else max(5, int(max_points ** (1 / k)))
    grids = [candidate_thresholds(calib, prerouter, t, per_tier) for t in range(k)]
    names = [t.name for t in table.tiers[:k]]
    if verifier is None:
        results = [(ths, evaluate(PreRoutePolicy(prerouter, ths), calib, ths[0])) for ths in itertools.product(*grids)]
        skip, on_calib, met = _pick(calib, results, target)
        vths: tuple[float, ...] = ()
        ref_cal = ref_held = None
    else:
        ref = reference or calibrate(table, verifier, target, seed=seed, fraction=fraction)
        if (ref.verifier, ref.target, ref.seed, ref.fraction) != (verifier, target, seed, fraction):
            raise ValueError("the reference calibration is for another verifier, target or split")
        vths, ref_cal, met, ref_held = tuple(ref.thresholds[n] for n in names), ref.calibration, ref.met, ref.held_out
        results = [
            (ths, evaluate(PreRoutePolicy(prerouter, ths, verifier, vths), calib, ths[0]))
            for ths in itertools.product(*grids)
        ]
        # skip threshold 0 never skips, so verify-only itself is always a candidate
        ok = [(ths, r) for ths, r in results if r.accuracy >= ref_cal.accuracy - max_drop - 1e-12]
        skip, on_calib = min(ok, key=lambda x: (x[1].cost_per_1k, -x[1].accuracy, x[0]))
    policy = PreRoutePolicy(prerouter, skip, verifier, vths)
    skipped = sum(0 not in policy.route(it).ran for it in held.items)
    return PreRouteCalibration(
        policy=policy.name,
        target=target,
        skip_below=dict(zip(names, skip, strict=True)),
        thresholds=dict(zip(names, vths, strict=False)),
        met=met,
        calibration=on_calib,
        held_out=evaluate(policy, held, skip[0]),
        reference_calibration=ref_cal,
        reference_held_out=ref_held,
        n_held_out=len(held.items),
        skip_rate=skipped / len(held.items),
    )


# ---- writing the thresholds --------------------------------------------------------------------------------


def toml_snippet(cal: Calibration, task: str | None = None) -> str:
    """The thresholds as config lines: each tier's policy for `task`, or (None) the tier's own."""
    lines = [
        f"# calibrated for {cal.target} with verifier '{cal.verifier}' (seed {cal.seed}, "
        f"{cal.n_calibration} calibration items)"
    ]
    for name, th in cal.thresholds.items():
        lines += ["[[tiers]]", f'name = "{name}"']
        if task is not None:
            lines += [f"[tiers.tasks.{task}]"]
        lines += [f"threshold = {th:.6g}", ""]
    return "\n".join(lines).rstrip() + "\n" + baseline_hint(cal, task)


def baseline_hint(cal: Calibration, task: str | None = None) -> str:
    """The first tier's acceptance rate at these thresholds on the calibration items, as the
    drift baseline a shadowed tier compares live acceptance with (`tiers[].shadow.baseline_accept`);
    a rate of 0 or 1 is no baseline (a detector cannot see a change from certainty)."""
    first = next(iter(cal.thresholds), None)
    rate = cal.calibration.answered[0] if cal.calibration.answered else None
    if first is None or rate is None or not 0.0 < rate < 1.0:
        return ""
    key = task if task is not None else '"*"'  # a bare TOML key cannot be *
    return (
        f"# drift baseline: tier '{first}' accepted {rate:.3f} of the calibration items at this threshold;\n"
        f"# with shadow on, put it in that tier's [tiers.shadow]: baseline_accept = {{ {key} = {rate:.3f} }}\n"
    )


_HEADER = re.compile(r"^\s*\[")
_NAME = re.compile(r'^\s*name\s*=\s*"([^"]*)"')
_THRESHOLD = re.compile(r"^(\s*)threshold\s*=\s*[^#\n]*(#.*)?$")


def _set_threshold(lines: list[str], start: int, end: int, after: int, value: str) -> None:
    """Set the `threshold` among lines[start:end] (one table's own keys), or insert it after line `after`."""
    for j in range(start, end):
        m = _THRESHOLD.match(lines[j])
        if m:
            comment = f"  {m.group(2)}" if m.group(2) else ""
            lines[j] = f"{m.group(1)}threshold = {value}{comment}\n"
            return
    lines.insert(after + 1, f"threshold = {value}\n")


def write_thresholds(path: Path, thresholds: dict[str, float], *, task: str | None = None) -> str:
    """Set each named tier's threshold in a config.toml, keeping every other line (and comment)
    as it is: the threshold of the tier's policy for `task` (`[tiers.tasks.<task>]`, added when
    the tier has none), or with no task the tier's own `threshold`. The result is validated before
    it replaces the file; returns the new text."""
    import os
    import tempfile

    from router.config import load_settings

    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    blocks: list[tuple[int, int, int]] = []  # per [[tiers]]: start, end of its own keys, end of its tables
    tier_starts = [i for i, line in enumerate(lines) if line.strip() == "[[tiers]]"]
    for k, i in enumerate(tier_starts):
        end = next((j for j in range(i + 1, len(lines)) if _HEADER.match(lines[j])), len(lines))
        blocks.append((i, end, tier_starts[k + 1] if k + 1 < len(tier_starts) else len(lines)))
    done: set[str] = set()
    for start, end, region_end in reversed(blocks):
        name = next((m.group(1) for j in range(start + 1, end) if (m := _NAME.match(lines[j]))), None)
        if name not in thresholds:
            continue
        value = f"{thresholds[name]:.6g}"
        if task is None:
            at = next(j for j in range(start + 1, end) if _NAME.match(lines[j]))
            _set_threshold(lines, start + 1, end, at, value)
        else:
            header = f"[tiers.tasks.{task}]"
            found = next((j for j in range(end, region_end) if lines[j].strip() == header), None)
            if found is not None:
                own_end = next((j for j in range(found + 1, len(lines)) if _HEADER.match(lines[j])), len(lines))
                _set_threshold(lines, found + 1, own_end, found, value)
            else:  # after the tier's last table, before the comments and blank lines that lead to the next
                last = max(
                    j for j in range(start, region_end) if lines[j].strip() and not lines[j].lstrip().startswith("#")
                )
                lines[last + 1 : last + 1] = ["\n", f"{header}\n", f"threshold = {value}\n"]
        done.add(name)
    missing = set(thresholds) - done
    if missing:
        raise ConfigError(f"{path}: no [[tiers]] named {', '.join(sorted(missing))}")
    text = "".join(lines)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        settings = load_settings(tmp)  # refuse to write a config that no longer loads
        for name, th in thresholds.items():
            tier = settings.tier(name)
            policy = tier.tasks.get(task) if task is not None else None  # type: ignore[call-overload]
            written = tier.threshold if task is None else (policy.threshold if policy is not None else None)
            if written is None or abs(written - th) > 1e-6:
                raise ConfigError(f"{path}: writing the threshold of tier '{name}' did not take")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return text


def split_options(args: object) -> list[str]:
    """The split and tier options of a command line, spelled back only where they differ from the
    defaults: what `eval report` and `eval train` print as the command that regenerates them."""
    parts: list[str] = []
    seed, fraction, tiers = getattr(args, "seed", 0), getattr(args, "fraction", 0.5), getattr(args, "tiers", None)
    if seed:
        parts += ["--seed", str(seed)]
    if fraction != 0.5:
        parts += ["--fraction", str(fraction)]
    if tiers:
        parts += ["--tiers", tiers]
    return parts
