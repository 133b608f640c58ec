"""The frontier report's files: README.md (the tables and what they mean) and frontier.csv (every
row: each cascade, verifier and share at the frontier's list price, and the chosen policies at the
other price points), written from `report.SuiteFrontier` alone so
the two cannot disagree. `headline` gives the rows the project README quotes; a test holds the
README to them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from evals.formatting import md_table, num, pct, th, usd
from evals.frontier.cascade import AGREES, BOOTSTRAP, SHARES, Interval, Row
from evals.frontier.published import TOP_PRICE_POINTS
from evals.frontier.report import LIST_PRICE, SuiteFrontier, best

HEADLINE_HEADER = (
    "suite",
    "cascade",
    "target",
    "policy",
    "accuracy / GPT-4's",
    "saved vs GPT-4 alone",
    "random, as accurate",
)


def ci(x: float, i: Interval) -> str:
    return f"{pct(x)} [{pct(i.low)}, {pct(i.high)}]"


def headline(reports: Sequence[SuiteFrontier]) -> list[list[str]]:
    """Per suite, cascade and share: the policy chosen on the calibration half, held out."""
    out = []
    for rep in reports:
        for cascade in rep.cascades:
            for share in SHARES:
                r = best(rep.rows, cascade, share)
                n = f"{rep.suite}, {rep.n_joined} items"
                if r is None:
                    out.append(
                        [n, cascade, pct(share, 0), "none met it on the calibration half", "–", "nothing saved", "–"]
                    )
                    continue
                held = r.calibration.n_held_out
                out.append(
                    [
                        f"{n} ({held} held out)",
                        cascade,
                        pct(share, 0),
                        f"`{r.verifier}`",
                        ci(r.accuracy_ratio, r.ratio_ci),
                        ci(r.saved, r.saved_ci),
                        pct(r.random_saved),
                    ]
                )
    return out


def verdict(rep: SuiteFrontier) -> list[str]:
    lines = []
    for cascade in rep.cascades:
        for share in SHARES:
            r = best(rep.rows, cascade, share)
            goal = f"{pct(share, 0)} of GPT-4-1106's accuracy"
            if r is None:
                lines.append(f"- {cascade}, {goal}: no policy met it on the calibration half; **nothing is saved**.")
            elif r.saved_ci.high <= 0:
                lines.append(
                    f"- {cascade}, {goal}: **nothing is saved**: the cheapest policy that meets it (`{r.verifier}`) "
                    f"costs {pct(-r.saved)} more than GPT-4-1106 alone (it escalates "
                    f"{pct(r.result.escalation_rate)} and pays the small tier too)."
                )
            elif r.saved_ci.low <= 0:
                lines.append(
                    f"- {cascade}, {goal}: `{r.verifier}` saves {ci(r.saved, r.saved_ci)}, an interval that holds "
                    f"zero: **no saving can be told from none** on {r.calibration.n_held_out} held-out items."
                )
            else:
                line = (
                    f"- {cascade}, {goal}: `{r.verifier}` saves {ci(r.saved, r.saved_ci)} at "
                    f"{ci(r.accuracy_ratio, r.ratio_ci)} of GPT-4-1106's held-out accuracy"
                )
                if r.random_saved is not None and r.saved_ci.low <= r.random_saved:
                    line += (
                        f"; escalating at random, as accurate, saves {pct(r.random_saved)}, inside that interval: "
                        "**the saving is bought with the accuracy given up, not by the verifier**"
                    )
                lines.append(line + ".")
    return lines


def _rows_table(rows: Sequence[Row]) -> list[str]:
    header = (
        "verifier",
        "target",
        "thresholds",
        "met on calibration",
        "held-out accuracy (GPT-4)",
        "accuracy / GPT-4's",
        "cost / 1k (GPT-4)",
        "saved",
        "random, as accurate, saves",
        "escalated",
    )
    body = []
    for r in rows:
        c = r.calibration
        body.append(
            [
                f"`{r.verifier}`",
                pct(r.share, 0),
                " / ".join(th(t) for t in c.thresholds.values()),
                "yes" if c.met else "no (nearest miss)",
                f"{pct(r.result.accuracy)} ({pct(r.top.accuracy)})",
                ci(r.accuracy_ratio, r.ratio_ci),
                f"{usd(r.result.cost_per_1k)} ({usd(r.top.cost_per_1k)})",
                ci(r.saved, r.saved_ci),
                pct(r.random_saved),
                pct(r.result.escalation_rate),
            ]
        )
    return md_table(header, body)


def _prices_table(rep: SuiteFrontier, cascade: str) -> list[str]:
    header = ("top tier charged as", "price per 1M in / out", "price ratio r", "target", "policy", "saved")
    body = []
    for point, price in TOP_PRICE_POINTS.items():
        for share in SHARES:
            r = best(rep.rows, cascade, share, point)
            ratio = next(x.price_ratio for x in rep.rows if x.cascade == cascade and x.price_point == point)
            body.append(
                [
                    f"{point} ({price.provider}, {price.as_of})",
                    f"${price.input_per_1m:g} / ${price.output_per_1m:g}",
                    num(ratio, 1),
                    pct(share, 0),
                    "none met it" if r is None else f"`{r.verifier}`",
                    "nothing saved" if r is None else ci(r.saved, r.saved_ci),
                ]
            )
    return md_table(header, body)


def markdown(reports: Sequence[SuiteFrontier], command: str) -> str:
    meta = reports[0].published
    src = meta["source"]
    out = [
        "# What would it save against a frontier model?",
        "",
        "Regenerate this page (no model, no network; seconds):",
        "",
        "```",
        command,
        "```",
        "",
        "The local small tier (Qwen2.5-Coder-0.5B, this project's stored per-item runs) in front of "
        "GPT-4-1106-preview, and in front of Mixtral-8x7B-Instruct then GPT-4-1106-preview, on the items both have. "
        "The frontier answers are RouteLLM's published per-item results "
        f"({src['repository']} at `{src['commit'][:12]}`, {src['license']}; "
        "provenance in `evals/data/routellm/PROVENANCE.md`), imported as eval runs: GSM8K answers regraded by "
        "this project's grader, MMLU's published correctness as is.",
        "",
        "**How to read it.** Thresholds are chosen on the calibration half (the project's split, by item id, seed "
        "0) by `evals.calibrate`: the cheapest setting whose accuracy is at least the target share of GPT-4-1106's "
        "accuracy on that half. Every figure below is on the other, held-out half. *Saved* is 1 minus the cascade's "
        "cost over GPT-4-1106 alone on the same items (negative: it costs more). Intervals are 95% percentile "
        f"bootstrap intervals over the held-out items ({BOOTSTRAP} resamples) at the chosen thresholds. *Policy* in a "
        "summary is the cheapest on the calibration half among those that met the target there, never picked by "
        "its held-out figures. A binary verifier that never rejects cannot reach a high target: it is listed as a "
        "nearest miss. *Random, as accurate* is the random-escalation baseline at the probability that makes it as "
        "accurate as the cascade on the held-out items: what giving up that much accuracy saves with no verifier. "
        "At other price points the thresholds are those chosen at GPT-4-1106's list price.",
        "",
        f"**Prices.** {_tokens_note(meta)} The small tier is charged per token at the throughput its first run "
        "measured (its hourly price over the tokens it produced), so a run measured on a loaded machine does not "
        "inflate it. Named price points below charge the same GPT-4-1106 answers at other models' list prices: "
        "the savings at the price ratio of a pair the reader pays for. Prices were read from the providers' "
        "published lists at the dates given and not re-checked from this machine.",
        "",
    ]
    summary = headline(reports)
    out += ["## Summary", "", *md_table(HEADLINE_HEADER, summary), ""]
    for rep in reports:
        out += _suite(rep)
    return "\n".join(out) + "\n"


def _tokens_note(meta: dict[str, object]) -> str:
    tok = meta["tokenizer"]
    assert isinstance(tok, dict)
    return (
        f"Tokens are counted with {tok['model']}'s vocabulary ({tok['how']}): the prompt is what this project's "
        "suite sends, the answer is RouteLLM's published one (its own prompts were few-shot; the cost here is what "
        "the cascade would send)."
    )


def _suite(rep: SuiteFrontier) -> list[str]:
    m = rep.published["matched"]
    out = [
        f"## {rep.suite}",
        "",
        f"Published rows: {m['published']:,}; matched to this suite's items by normalized text: {m['matched']:,} of "
        f"{m['suite']:,} ({m['unmatched']} rows unmatched, {m['ambiguous']} matching more than one item). Items with "
        f"small-tier results ({', '.join(f'`{r}`' for r in rep.local_runs)}): {rep.n_local}; of them with frontier "
        f"answers: **{rep.n_joined}**.",
        "",
    ]
    tier_rows = [
        [
            t.name,
            t.price_text,
            pct(t.accuracy),
            usd(t.cost_per_1k),
            num(t.prompt_tokens, 0),
            num(t.completion_tokens, 0),
        ]
        for t in rep.tiers
    ]
    header = ("tier", "price", "accuracy", "cost / 1k", "prompt tokens", "answer tokens")
    out += [f"Each tier alone, on the {rep.n_joined} items:", "", *md_table(header, tier_rows), ""]
    grading = rep.published["grading"]
    if any(isinstance(v, dict) for v in grading.values()):
        out += _grading(grading)
    if rep.left_out:
        out += [
            f"Left out: {', '.join(f'`{v}`' for v in rep.left_out)}: they read the answer with the local large "
            "model; a hosted frontier API gives no log-probabilities of a given text to stand in for it.",
            "",
        ]
    out += ["**What it saves, held out, at GPT-4-1106's list price:**", ""]
    small = rep.tiers[0].accuracy
    if rep.chance is not None and small < rep.chance + 0.05:
        out += [
            f"The small tier is right on {pct(small)} of these items, hardly more than a guess's {pct(rep.chance)}, "
            "so a verifier has little to find: **nothing is saved** except by answering worse (compare each saving "
            "below with escalating at random, as accurate).",
            "",
        ]
    out += [*verdict(rep), ""]
    if rep.no_three_tier:
        out += [f"No three-tier cascade: {rep.no_three_tier}.", ""]
    for cascade in rep.cascades:
        listed = [r for r in rep.rows if r.cascade == cascade and r.price_point == LIST_PRICE]
        first = listed[0].calibration
        out += [
            f"### {cascade}",
            "",
            f"{first.n_calibration} calibration items, {first.n_held_out} held out. Top tier at "
            f"{listed[0].top_price}; price ratio r (GPT-4-1106's mean cost per request over the small tier's) "
            f"{num(listed[0].price_ratio, 1)}.",
        ]
        if "mixtral" in cascade:
            out += [f"Mixtral accepts its answer when it {AGREES} (their final numbers agree)."]
        out += ["", *_rows_table(listed), "", "At other price points (policy and saving held out, as above):", ""]
        out += [*_prices_table(rep, cascade), ""]
    return out


def _grading(grading: dict[str, object]) -> list[str]:
    out = [
        f"GSM8K answers are graded by this project's grader ({grading['grader']}). Where it and RouteLLM's label "
        "(the answer's last integer against the reference) disagree:",
        "",
    ]
    rows, examples = [], []
    for tier, g in grading.items():
        if not isinstance(g, dict):
            continue
        rows.append(
            [
                tier,
                str(g["both_right"]),
                str(g["both_wrong"]),
                str(g["ours_right_published_wrong"]),
                str(g["ours_wrong_published_right"]),
            ]
        )
        examples += g["examples"]
    header = ("tier", "both right", "both wrong", "ours right, RouteLLM's wrong", "ours wrong, RouteLLM's right")
    out += [*md_table(header, rows), ""]
    ex = [
        [
            e["item"],
            e["tier"],
            "right" if e["ours"] else "wrong",
            str(e["reference"]),
            f"`{e['extracted']}`",
            "…" + e["tail"][-90:],
        ]
        for e in examples
    ]
    out += [
        "Examples. Ours reads a stated final answer (`####`, `\\boxed{}`, 'the answer is') before the last number "
        "and compares numbers ('$20.00' is 20); RouteLLM's takes the last run of digits, so it misses '20.00' "
        "(reads 00) and credits '-15' or '0.5' when the reference is 15 or 5:",
        "",
        *md_table(("item", "tier", "ours", "reference", "ours read", "the answer's end"), ex),
        "",
    ]
    return out


CSV_FIELDS = (
    "suite",
    "cascade",
    "price_point",
    "top_price",
    "price_ratio",
    "verifier",
    "share",
    "thresholds",
    "met_calibration",
    "n_calibration",
    "n_held_out",
    "accuracy",
    "top_accuracy",
    "accuracy_ratio",
    "ratio_low",
    "ratio_high",
    "cost_per_1k",
    "top_cost_per_1k",
    "saved",
    "saved_low",
    "saved_high",
    "random_saved",
    "escalation_rate",
)


def csv_text(reports: Sequence[SuiteFrontier]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for rep in reports:
        for r in rep.rows:
            c = r.calibration
            w.writerow(
                [
                    r.suite,
                    r.cascade,
                    r.price_point,
                    r.top_price,
                    f"{r.price_ratio:.4f}",
                    r.verifier,
                    r.share,
                    "/".join(f"{t:.6g}" for t in c.thresholds.values()),
                    c.met,
                    c.n_calibration,
                    c.n_held_out,
                    f"{r.result.accuracy:.6f}",
                    f"{r.top.accuracy:.6f}",
                    f"{r.accuracy_ratio:.6f}",
                    f"{r.ratio_ci.low:.6f}",
                    f"{r.ratio_ci.high:.6f}",
                    f"{r.result.cost_per_1k:.6f}",
                    f"{r.top.cost_per_1k:.6f}",
                    f"{r.saved:.6f}",
                    f"{r.saved_ci.low:.6f}",
                    f"{r.saved_ci.high:.6f}",
                    "" if r.random_saved is None else f"{r.random_saved:.6f}",
                    f"{r.result.escalation_rate:.6f}",
                ]
            )
    return buf.getvalue()


def write(reports: Sequence[SuiteFrontier], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "README.md", out / "frontier.csv"]
    paths[0].write_text(markdown(reports, command), encoding="utf-8")
    paths[1].write_text(csv_text(reports), encoding="utf-8")
    return paths
