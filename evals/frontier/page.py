"""The frontier report's files: README.md (the tables and what they mean), frontier.csv (every
fixed-split row: each cascade, verifier and share at the frontier's list price, and the chosen
policies at the other price points), splits.csv (every headline over the random splits, at every
local price multiple) and price-sensitivity.png, written from `report.SuiteFrontier` alone so they
cannot disagree. The headline sections are `headlines`'; its `summary_rows` are what the project
README quotes, and a test holds the README to them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from evals.calibrate import MAX_POINTS
from evals.formatting import md_table, num, pct, th, usd
from evals.frontier import headlines as hl
from evals.frontier.cascade import AGREES, SHARES, Row
from evals.frontier.published import TOP_PRICE_POINTS
from evals.frontier.report import FINER, LIST_PRICE, VERIFIED, SuiteFrontier, best, headline_of
from evals.splits import BOOTSTRAP, MULTIPLIERS, Interval

FIGURE = "price-sensitivity.png"


def ci(x: float, i: Interval) -> str:
    return f"{pct(x)} [{pct(i.low)}, {pct(i.high)}]"


def verdict(rep: SuiteFrontier) -> list[str]:
    """Per cascade and share, in words: the median over the splits first, the fixed split beside."""
    lines = []
    for cascade in rep.cascades:
        for share in SHARES:
            h = headline_of(rep, cascade, share)
            r = best(rep.rows, cascade, share)
            goal = f"{pct(share, 0)} of GPT-4-1106's accuracy"
            if h is None:
                continue
            d = h.deployed
            saved = d.saved_spread()
            text = (
                f"- {cascade}, {goal}: over {rep.n_splits} splits it saves {hl.spread(saved)} (median [95% of splits]) "
                f"at {hl.spread(d.ratio_spread())} of GPT-4-1106's held-out accuracy, below the target on "
                f"{pct(d.missed_share)} of splits; answered by {hl.answered(h)}"
            )
            if d.fallback_share > 0:
                text += f"; on {pct(d.fallback_share)} of splits no policy met the target on the calibration half"
            if saved.high <= 0:
                text += ". **Nothing is saved** on any but the luckiest splits"
            elif saved.low <= 0:
                text += ". **No saving can be told from none**: the range holds zero"
            if "mixtral" in cascade and cascade != VERIFIED and h.deployed.answered_spread()[0].median == 0:
                text += (
                    ". The small tier answers nothing (its threshold is never reached): what is saved is Mixtral's "
                    f"answer accepted where it {AGREES}"
                )
            if r is not None:
                text += f". Fixed split: `{r.verifier}` saves {ci(r.saved, r.saved_ci)}"
                if r.random_saved is not None and r.saved_ci.low <= r.random_saved:
                    text += (
                        f"; escalating at random, as accurate, saves {pct(r.random_saved)}, inside that interval: "
                        "the saving is bought with the accuracy given up, not by the verifier"
                    )
            lines.append(text + ".")
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
        "Regenerate this page (no model, no network; a minute):",
        "",
        "```",
        command,
        "```",
        "",
        "The local small tier (Qwen2.5-Coder-0.5B, this project's stored per-item runs) in front of "
        "GPT-4-1106-preview, and in front of Mixtral-8x7B-Instruct then GPT-4-1106-preview, on the items both have; "
        "and the anchors' own setup, Mixtral in front of GPT-4 with Mixtral's answer verified after generation. "
        "The frontier answers are RouteLLM's published per-item results "
        f"({src['repository']} at `{src['commit'][:12]}`, {src['license']}; "
        "provenance in `evals/data/routellm/PROVENANCE.md`), imported as eval runs: GSM8K answers regraded by "
        "this project's grader, MMLU's published correctness as is.",
        "",
        "**How to read it.** Thresholds are chosen on a calibration half by `evals.calibrate` (the cheapest setting "
        "whose accuracy is at least the target share of GPT-4-1106's accuracy on that half, over "
        f"{MAX_POINTS} candidate thresholds per tier) and every figure is on the other, held-out half. *Saved* is 1 "
        "minus the cascade's cost over GPT-4-1106 alone on the same items (negative: it costs more). *Policy* is "
        "the cheapest on the calibration half among those that met the target there, never picked by its "
        "held-out figures. The headline figures are medians over random splits, each choosing afresh; the fixed "
        f"split's tables below carry 95% percentile bootstrap intervals over its held-out items ({BOOTSTRAP} "
        "resamples) at its chosen thresholds. A binary verifier that never rejects cannot reach a high target: it "
        "is listed as a nearest miss. *Random, as accurate* is the random-escalation baseline at the probability "
        "that makes it as accurate as the cascade on the held-out items: what giving up that much accuracy saves "
        "with no verifier. At other price points the thresholds are those chosen at GPT-4-1106's list price.",
        "",
        f"**Prices.** {_tokens_note(meta)} The small tier is charged per token at the throughput its first run "
        "measured (its hourly price over the tokens it produced), so a run measured on a loaded machine does not "
        "inflate it; the price sensitivity below shows what a dearer busy hour does. Named price points charge "
        "the same GPT-4-1106 answers at other models' list prices. Prices were read from the providers' "
        "published lists at the dates given and not re-checked from this machine.",
        "",
    ]
    out += ["## Summary", "", *hl.summary_text(reports), *md_table(hl.SUMMARY_HEADER, hl.summary_rows(reports)), ""]
    out += ["## The anchors' own setup: Mixtral → GPT-4, verified after generation", ""]
    out += [*_anchor_intro(), *md_table(*hl.anchor_rows(reports)), "", *hl.anchor_verdict(reports), ""]
    out += ["## Price sensitivity: the local machine's price per busy hour", ""]
    for rep in reports:
        out += [f"**{rep.suite}.** " + hl.price_text(rep)[0], "", *md_table(*hl.price_rows(rep)), ""]
    out += [f"![{FIGURE}]({FIGURE})", ""]
    worst = max(hl.grid_moves(rep) for rep in reports)
    out += [
        "## The threshold grid",
        "",
        f"Each headline again with {FINER}x as many candidate thresholds per tier ({FINER * MAX_POINTS}), on the "
        f"same splits: the largest move of a median saving or accuracy ratio is {num(worst, 2)} points.",
        "",
    ]
    for rep in reports:
        out += [*md_table(*hl.grid_rows(rep)), ""]
    for rep in reports:
        out += _suite(rep)
    return "\n".join(out) + "\n"


def _anchor_intro() -> list[str]:
    return [
        "RouteLLM (LMSYS, 2024) reports that its routers, with Mixtral-8x7B as the weak model and GPT-4 as the "
        "strong one, save 35% on GSM8K and 45% on MMLU against GPT-4 alone at 95% of GPT-4's quality. A router "
        "decides from the prompt, before anything is generated, and RouteLLM counts the calls to GPT-4 it avoids. "
        "Here Mixtral answers every request and its published answer is checked before it is accepted, so "
        "Mixtral's own cost and the checks' are paid on every request, and the saving is in dollars. What reads "
        "Mixtral's text, and how well, is in the GSM8K section below; the policy is chosen per split among all of "
        "them and their combinations. The ceiling is a perfect verifier: Mixtral's answer taken exactly where it "
        "is right.",
        "",
    ]


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
    if rep.signals:
        out += _signals(rep)
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
            f"Top tier at {listed[0].top_price}; price ratio r (GPT-4-1106's mean cost per request over the first "
            f"tier's) {num(listed[0].price_ratio, 1)}.",
        ]
        if "mixtral" in cascade and cascade != VERIFIED:
            out += [f"Mixtral accepts its answer when it {AGREES} (their final numbers agree)."]
        shown = None
        if cascade == VERIFIED:  # the combinations only where a split or the fixed split chose one
            chosen = {r.verifier for share in SHARES if (r := best(rep.rows, cascade, share)) is not None}
            shown = {r.verifier for r in listed if not r.verifier.startswith(("min(", "mean("))} | chosen
            listed = [r for r in listed if r.verifier in shown]
            out += [
                "",
                f"Every signal and their {len(h0.per_verifier) if (h0 := headline_of(rep, cascade, SHARES[0])) else 0} "
                "candidates in all "
                "(each pair's `min` and `mean`, the learned estimator) were calibrated on every split; the tables "
                "show the single signals, the learned estimator and the combinations some split deployed.",
            ]
        for share in SHARES:
            h = headline_of(rep, cascade, share)
            if h is None:
                continue
            out += [
                "",
                f"Over {rep.n_splits} splits, target {pct(share, 0)} (median [95% of splits], each verifier "
                "calibrated on every calibration half; *deployed*: how often the rule chose it):",
                "",
                *md_table(*hl.verifier_rows(h, shown)),
            ]
        out += [
            "",
            f"The fixed split: {first.n_calibration} calibration items, {first.n_held_out} held out.",
            "",
            *_rows_table(listed),
            "",
            "At other price points (fixed split; policy and saving held out, as above):",
            "",
        ]
        out += [*_prices_table(rep, cascade), ""]
    return out


def _signals(rep: SuiteFrontier) -> list[str]:
    header = (
        "signal on Mixtral's answer",
        "answers scored",
        "AUROC (all items)",
        "answers it scores 1",
        "Mixtral right there",
        "cost / 1k requests",
    )
    rows = [
        [
            f"`{s.label}`",
            f"{s.scored:,}",
            num(s.auroc),
            pct(s.top_share),
            pct(s.top_accuracy),
            usd(s.cost_per_1k),
        ]
        for s in rep.signals
    ]
    out = [
        f"What reads Mixtral's published answers here (`evals.frontier.verified`), each a verifier of the "
        f"{VERIFIED} cascade:",
        "",
        *md_table(header, rows),
        "",
    ]
    out += [f"- {n}" for n in rep.signal_notes]
    return out + [""] if rep.signal_notes else out


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


SPLITS_FIELDS = (
    "suite",
    "cascade",
    "share",
    "policy",
    "splits",
    "local_price_multiple",
    "saved_median",
    "saved_low",
    "saved_high",
    "accuracy_ratio_median",
    "accuracy_ratio_low",
    "accuracy_ratio_high",
    "below_target_share",
    "no_policy_share",
    "first_tier_answered_median",
)


def splits_csv(reports: Sequence[SuiteFrontier]) -> str:
    """Every headline's policy and each verifier over the splits, at every local price multiple."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SPLITS_FIELDS)
    for rep in reports:
        ms = sorted({m for _, m in hl.multipliers(rep)} | set(MULTIPLIERS))
        for h in rep.headlines:
            for o in [h.deployed, *h.per_verifier]:
                ratio = o.ratio_spread()
                for m in ms:
                    saved = o.saved_spread(m)
                    w.writerow(
                        [
                            rep.suite,
                            h.cascade,
                            h.share,
                            "deployed" if o is h.deployed else o.label,
                            rep.n_splits,
                            f"{m:.4g}",
                            f"{saved.median:.6f}",
                            f"{saved.low:.6f}",
                            f"{saved.high:.6f}",
                            f"{ratio.median:.6f}",
                            f"{ratio.low:.6f}",
                            f"{ratio.high:.6f}",
                            f"{o.missed_share:.6f}",
                            f"{o.fallback_share:.6f}",
                            f"{o.answered_spread()[0].median:.6f}",
                        ]
                    )
    return buf.getvalue()


def write(reports: Sequence[SuiteFrontier], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "README.md", out / "frontier.csv", out / "splits.csv", out / FIGURE]
    paths[0].write_text(markdown(reports, command), encoding="utf-8")
    paths[1].write_text(csv_text(reports), encoding="utf-8")
    paths[2].write_text(splits_csv(reports), encoding="utf-8")
    paths[3].write_bytes(hl.price_figure(reports))
    return paths
