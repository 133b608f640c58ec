"""GPT-4o and GPT-4-turbo as the top tier of the bfcl suite: the leaderboard's published per-item
correctness of both, read from the committed `evals/data/bfcl/per_item_correct.csv`, imported as an
eval run, and joined with the local small tier's bfcl runs by `tierroute eval frontier --local
bfcl=RUN` (the same calibration, held-out rows and bootstrap as the GSM8K and MMLU report:
`evals.frontier.cascade`).

**What was published, and what can be checked here.** The Berkeley Function Calling Leaderboard's
result dump (`HuanzhiMao/BFCL-Result`, results of 2024-08-11; PROVENANCE.md beside the data) lists
per model and v1 category the items its AST checker failed. The dump has no licence, so only the
derived 0/1 per model and item is committed, for 11 models; two are read here,
`gpt-4o-2024-08-06-FC` and `gpt-4-turbo-2024-04-09-FC` (OpenAI's function-calling API). This reader
checks that the file is whole and well formed (every item of the four v1 files once per model, a
0 or 1 each) and that each `(v1_category, index0)` names an item of this suite (its v1 file's row of
that index has the id `<category>_<index0>`), and a test recounts the accuracies it implies. It cannot
check the verdicts themselves: the answers are not published, so whether this project's grader
(`evals.bfcl_checks`, BFCL's rules, with the small differences its docstring states) would agree
with the leaderboard's on them is unknown, and one item the leaderboard's v1 data could not grade
(`parallel_multiple_function_179`, failed by every model: its ground truth put a parameter beside
the calls) is in the published record as failed. Nor can any verifier read an answer that is not
there: a published tier can only be the last one.

**Prices.** Each model at its list price (`PRICES`: GPT-4o-2024-08-06 $2.50 / $10 per 1M input /
output tokens, GPT-4-turbo-2024-04-09 $10 / $30, OpenAI's lists as read in 2024, not re-checked
from this machine). Token counts are estimates, counted once by `scripts/bfcl_frontier_tokens.py`
into `evals/data/bfcl/frontier_tokens.json` (so reading them needs no model), in the small tier's
vocabulary (Qwen2.5-Coder-0.5B via llama.cpp `vocab_only`), as the RouteLLM subset is counted:

- prompt: the question as the user message plus OpenAI's chat overhead (3 per message, 3 for the
  reply), and each offered function's definition as the JSON text the API is sent (`prompt_texts`).
  OpenAI bills function definitions as prompt tokens in a rendering of its own and counts in its
  own vocabularies (o200k for GPT-4o, cl100k for GPT-4-turbo), so this is an estimate of the bill;
- answer: not published. It is estimated from the ground truth's own calls
  (`bfcl_checks.canonical_calls`), each written as `{"name": ..., "arguments": {...}}`
  (`answer_texts`), the same for a right and a wrong answer: a wrong answer's length is unknown.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evals import measures
from evals.bfcl_checks import canonical_calls
from evals.calibrate import Calibration
from evals.formatting import md_table, num, pct, th, usd
from evals.frontier.cascade import SHARES, Row, calibrations, held_out_row, join, local_table
from evals.frontier.page import csv_text
from evals.frontier.published import ListPrice
from evals.frontier.report import SuiteFrontier, TierLine, cascade_name
from evals.frontier.runs import published_tier, replace_run
from evals.splits import BOOTSTRAP, Interval
from evals.store import GenerationRecord, GradeRecord, RunStore, digest, generation_key, grade_key
from evals.suites.base import Item, Suite
from evals.sweep import ResultTable, load_table
from router.errors import ConfigError
from router.generation import GenerationRequest

DATA_DIR = Path("evals/data/bfcl")
CORRECT_FILE = "per_item_correct.csv"
TOKENS_FILE = "frontier_tokens.json"
RUN = "bfcl-published"
GPT4O = "gpt-4o-2024-08-06"
GPT4_TURBO = "gpt-4-turbo-2024-04-09"
TOPS = (GPT4O, GPT4_TURBO)
MODELS = {GPT4O: "gpt-4o-2024-08-06-FC", GPT4_TURBO: "gpt-4-turbo-2024-04-09-FC"}  # as the leaderboard names them
PRICES: dict[str, ListPrice] = {
    GPT4O: ListPrice(2.5, 10.0, "OpenAI", "as listed from August 2024"),
    GPT4_TURBO: ListPrice(10.0, 30.0, "OpenAI", "as listed from April 2024"),
}
# the leaderboard's v1 category names -> the suite's, and each file's item count
V1_CATEGORIES = {
    "simple": ("simple", 400),
    "multiple_function": ("multiple", 200),
    "parallel_function": ("parallel", 200),
    "parallel_multiple_function": ("parallel_multiple", 200),
}
SOURCE = {
    "repository": "HuanzhiMao/BFCL-Result",
    "commit": "b4adfc9be5e0c65e8dbb1340c689688eb92a9379",
    "results": "2024-08-11",
    "license": "none published: only the derived per-item correctness is committed",
}
PER_MESSAGE, PER_REPLY = 3, 3


@dataclass(frozen=True)
class PublishedBFCL:
    correct: Mapping[str, Mapping[str, bool]]  # tier -> item id -> the leaderboard's verdict
    tokens: Mapping[str, tuple[int, int]]  # item id -> (prompt, answer) tokens, both estimated
    tokenizer: Mapping[str, Any]  # the tokens file's account of how they were counted

    @property
    def items(self) -> list[str]:
        return sorted(self.tokens, key=_order)


def _order(item_id: str) -> tuple[int, int]:
    category, _, index = item_id.removeprefix("bfcl/").rpartition("_")
    return list(V1_CATEGORIES).index(category), int(index)


def prompt_texts(request: GenerationRequest) -> tuple[list[str], list[str]]:
    """What a hosted tier is sent for an item (the suite's request): the message contents, and each
    function's definition as the JSON text of OpenAI's `tools` entry (the prompt side of the estimate)."""
    assert request.messages is not None
    return [m.content for m in request.messages], [json.dumps(t.to_openai(), ensure_ascii=False) for t in request.tools]


def answer_texts(reference: Mapping[str, Any]) -> list[str]:
    """The ground truth's own calls as text, one per call (the answer side of the estimate)."""
    return [json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in canonical_calls(reference)]


def load(data_dir: Path = DATA_DIR) -> PublishedBFCL:
    """The committed correctness of `TOPS` and the token estimates, checked as they are read."""
    tokens_path = data_dir / TOKENS_FILE
    try:
        raw_tokens = json.loads(tokens_path.read_text(encoding="utf-8"))
        tokens = {
            str(k): (_count(v[0], f"{k} prompt"), _count(v[1], f"{k} answer")) for k, v in raw_tokens["items"].items()
        }
        tokenizer = dict(raw_tokens["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"cannot read {tokens_path}: {exc}") from None
    wanted = {MODELS[t]: t for t in TOPS}
    correct: dict[str, dict[str, bool]] = {t: {} for t in TOPS}
    path = data_dir / CORRECT_FILE
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != ["model", "v1_category", "index0", "correct"]:
            raise ConfigError(f"{path}: columns must be model, v1_category, index0, correct")
        for n, row in enumerate(reader, 2):
            tier = wanted.get(row["model"])
            if tier is None:
                continue
            try:
                item_id = _item_id(row["v1_category"], row["index0"])
                if row["correct"] not in ("0", "1"):
                    raise ValueError(f"correct must be 0 or 1, not {row['correct']!r}")
            except ValueError as exc:
                raise ConfigError(f"{path} line {n}: {exc}") from None
            if item_id in correct[tier]:
                raise ConfigError(f"{path} line {n}: {row['model']} {item_id} twice")
            correct[tier][item_id] = row["correct"] == "1"
    expected = {_item_id(c, str(i)) for c, (_, size) in V1_CATEGORIES.items() for i in range(size)}
    for tier, verdicts in correct.items():
        if set(verdicts) != expected:
            missing = sorted(expected - set(verdicts), key=_order)
            raise ConfigError(f"{path}: {MODELS[tier]} lacks {len(missing)} items ({', '.join(missing[:3])}, ...)")
    if set(tokens) != expected:
        raise ConfigError(f"{tokens_path}: token estimates must cover exactly the {len(expected)} v1 items")
    return PublishedBFCL(correct, tokens, tokenizer)


def _item_id(category: str, index: str) -> str:
    if category not in V1_CATEGORIES:
        raise ValueError(f"unknown v1 category {category!r}")
    if not index.isdigit() or not 0 <= int(index) < V1_CATEGORIES[category][1]:
        raise ValueError(f"index0 {index!r} is outside {category}'s {V1_CATEGORIES[category][1]} items")
    return f"bfcl/{category}_{int(index)}"


def _count(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1_000_000:
        raise ValueError(f"{what} must be a token count")
    return v


# ---- the published tiers as an eval run --------------------------------------------------------


def tier_fingerprint(tier: str) -> str:
    return digest("published", SOURCE["repository"], SOURCE["commit"], MODELS[tier])


def write_run(published: PublishedBFCL, suite: Suite, runs_dir: Path) -> Path:
    """Write (or rewrite whole) the run `runs_dir/bfcl-published`: one tier per model of `TOPS`,
    over the published items this suite has (its categories), graded by the published verdicts."""
    items = {it.id: it for it in suite.load()}
    return replace_run(runs_dir, RUN, lambda tmp: _write(published, suite, items, tmp))


async def _write(published: PublishedBFCL, suite: Suite, items: Mapping[str, Item], root: Path) -> None:
    kept = [i for i in published.items if i in items]
    detail = (
        f"published correctness ({SOURCE['repository']}, results of {SOURCE['results']}); the answer was not published"
    )
    gens, grades = [], []
    for tier in TOPS:
        fp = tier_fingerprint(tier)
        for item_id in kept:
            item = items[item_id]
            gk = generation_key(fp, item.prompt_sha)
            prompt, answer = published.tokens[item_id]
            gens.append(GenerationRecord(gk, tier, item_id, MODELS[tier], "", "stop", prompt, answer, 0.0))
            correct = published.correct[tier][item_id]
            grades.append(
                GradeRecord(grade_key(gk, suite.fingerprint, item_id), gk, tier, item_id, correct, None, detail)
            )
    with RunStore(root) as store:
        store.add_generations(gens)
        store.add_grades(grades)
    left = len(published.items) - len(kept)
    RunStore(root).write_manifest(_manifest(published, suite, items, kept, left))


def _manifest(
    published: PublishedBFCL, suite: Suite, items: Mapping[str, Item], kept: list[str], left: int
) -> dict[str, Any]:
    tiers = [published_tier(t, MODELS[t], tier_fingerprint(t), PRICES[t].settings(t)) for t in TOPS]
    right = {t: sum(published.correct[t][i] for i in kept) for t in TOPS}
    return {
        "name": RUN,
        "suite": {
            "name": suite.name,
            "fingerprint": suite.fingerprint,
            "task": suite.task,
            "source": f"{suite.source}; correctness published by {SOURCE['repository']}",
            "limit": None,
            "seed": 0,
        },
        "tiers": tiers,
        "items": [{"id": i, "prompt_sha": items[i].prompt_sha, "group": items[i].group} for i in kept],
        "published": {
            "source": SOURCE,
            "tokenizer": dict(published.tokenizer),
            "matched": {
                "published": len(published.items),
                "suite": len(items),
                "kept": len(kept),
                "not_in_suite": left,
            },
            "prices": {t: asdict(PRICES[t]) for t in TOPS},
            "published_right": right,
            "grading": {"grader": "published labels"},
        },
    }


# ---- the report --------------------------------------------------------------------------------


def build(
    suite: Suite,
    local_stores: Sequence[RunStore],
    runs_dir: Path,
    *,
    data_dir: Path = DATA_DIR,
    seed: int = 0,
    fraction: float = 0.5,
) -> SuiteFrontier:
    """small -> GPT-4o and small -> GPT-4-turbo, each calibrated for every share and verifier at the
    model's own list price and reported on the held-out half."""
    store = RunStore(write_run(load(data_dir), suite, runs_dir))
    frontier = load_table(store)
    local, left_out = local_table(local_stores)
    rows: list[Row] = []
    tables: dict[str, ResultTable] = {}
    for top in TOPS:
        name = cascade_name([top])
        tables[name] = table = join(local, frontier, [top])
        if not table.items:
            raise ConfigError(f"no item of the local runs has published results ({store.name})")
        for share, cal in calibrations(table, seed=seed, fraction=fraction):
            rows.append(
                held_out_row(
                    table, cal, share, suite=suite.name, cascade=name, price_point=top, seed=seed, fraction=fraction
                )
            )
    first = next(iter(tables.values()))
    lines = [_line(first, 0)] + [_line(t, 1) for t in tables.values()]
    return SuiteFrontier(
        suite=suite.name,
        local_runs=[s.name for s in local_stores],
        n_local=len(local.items),
        n_joined=len(first.items),
        left_out=left_out,
        published=store.manifest()["published"],
        tiers=lines,
        cascades=list(tables),
        rows=rows,
    )


def _line(table: ResultTable, i: int) -> TierLine:
    outs = [it.tiers[i] for it in table.items]
    n = len(outs)
    t = table.tiers[i]
    return TierLine(
        name=t.name,
        model=t.model,
        price_text=t.price_text,
        accuracy=sum(o.correct for o in outs) / n,
        cost_per_1k=measures.cost_per_1k([o.cost_usd for o in outs]),
        prompt_tokens=sum(o.prompt_tokens for o in outs) / n,
        completion_tokens=sum(o.completion_tokens for o in outs) / n,
    )


def chosen(rows: Sequence[Row], cascade: str, share: float) -> Row | None:
    """The policy a user would deploy: among those that met the target on the calibration half, the
    cheapest there (the rule of `evals.frontier.report.best`, never picked by held-out figures)."""
    pool = [r for r in rows if r.cascade == cascade and r.share == share and r.calibration.met]
    return min(pool, key=lambda r: (r.calibration.calibration.cost_per_1k, r.verifier), default=None)


def _ci(x: float, i: Interval) -> str:
    return f"{pct(x)} [{pct(i.low)}, {pct(i.high)}]"


def markdown(rep: SuiteFrontier, command: str) -> str:
    m = rep.published["matched"]
    tok = rep.published["tokenizer"]
    prices = "; ".join(
        f"{t}: ${p.input_per_1m:g} / ${p.output_per_1m:g} per 1M input / output tokens ({p.provider}, {p.as_of})"
        for t, p in PRICES.items()
    )
    out = [
        "# BFCL: what would the small tier save in front of GPT-4o or GPT-4-turbo?",
        "",
        "Regenerate this page (no model, no network; seconds):",
        "",
        "```",
        command,
        "```",
        "",
        "The local small tier (this project's stored bfcl runs: "
        f"{', '.join(f'`{r}`' for r in rep.local_runs)}) in front of GPT-4o-2024-08-06 or GPT-4-turbo-2024-04-09, "
        "each called through OpenAI's function-calling API, on the BFCL v1 items both have. The frontier tiers are "
        f"the leaderboard's **published per-item correctness** ({SOURCE['repository']} at `{SOURCE['commit'][:12]}`, "
        f"results of {SOURCE['results']}; `evals/data/bfcl/PROVENANCE.md`): {m['published']} items, of which "
        f"{m['kept']} are in this suite ({m['not_in_suite']} of categories it does not load). "
        f"Items with small-tier results: {rep.n_local}; of them with published results: **{rep.n_joined}**.",
        "",
        "**What can and cannot be verified.** Checked here: the file is complete and well formed, every "
        "(category, index) names this suite's item, and the accuracies it implies. Not checkable: the verdicts "
        "themselves (the answers were not published, so whether this project's grader, `evals/bfcl_checks.py`, "
        "would agree with the leaderboard's on them is unknown; `parallel_multiple_function_179` is failed for "
        "every model by a fault in the leaderboard's v1 ground truth that this suite repairs), what the models "
        "wrote, and how many tokens they used. No verifier can read an answer that is not there, so a published "
        "tier is only ever the last tier.",
        "",
        f"**Prices.** {prices}; prices are not re-checked from this machine. Token counts are estimates in "
        f"{tok['model']}'s vocabulary ({tok['how']}). The small tier is charged per token at the throughput its "
        "first run measured.",
        "",
        "**How to read it.** As the GSM8K and MMLU frontier report: thresholds chosen on the calibration half (seed "
        f"and fraction in the command) for a share of the top tier's accuracy there; figures on the held-out half; "
        f"95% percentile bootstrap intervals ({BOOTSTRAP} resamples); *random, as accurate* is escalating at random "
        "as often as makes it as accurate.",
        "",
    ]
    header = ("tier", "price", "accuracy", "cost / 1k", "prompt tokens", "answer tokens")
    body = [
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
    out += [f"Each tier alone, on the {rep.n_joined} items:", "", *md_table(header, body), ""]
    if rep.left_out:
        out += [f"Left out: {', '.join(f'`{v}`' for v in rep.left_out)} (their work was done by another tier).", ""]
    summary = []
    for cascade in rep.cascades:
        for share in SHARES:
            r = chosen(rep.rows, cascade, share)
            if r is None:
                summary.append(
                    [cascade, pct(share, 0), "none met it on the calibration half", "–", "nothing saved", "–"]
                )
                continue
            summary.append(
                [
                    cascade,
                    pct(share, 0),
                    f"`{r.verifier}`",
                    _ci(r.accuracy_ratio, r.ratio_ci),
                    _ci(r.saved, r.saved_ci),
                    pct(r.random_saved),
                ]
            )
    head = (
        "cascade",
        "target",
        "policy",
        "accuracy / top tier's",
        "saved vs the top tier alone",
        "random, as accurate",
    )
    out += ["## Summary", "", *md_table(head, summary), ""]
    for cascade in rep.cascades:
        out += _cascade(rep, cascade)
    return "\n".join(out) + "\n"


def _cascade(rep: SuiteFrontier, cascade: str) -> list[str]:
    rows = [r for r in rep.rows if r.cascade == cascade]
    first: Calibration = rows[0].calibration
    header = (
        "verifier",
        "target",
        "thresholds",
        "met on calibration",
        "held-out accuracy (top)",
        "accuracy / top's",
        "cost / 1k (top)",
        "saved",
        "random, as accurate, saves",
        "escalated",
    )
    body = [
        [
            f"`{r.verifier}`",
            pct(r.share, 0),
            " / ".join(th(t) for t in r.calibration.thresholds.values()),
            "yes" if r.calibration.met else "no (nearest miss)",
            f"{pct(r.result.accuracy)} ({pct(r.top.accuracy)})",
            _ci(r.accuracy_ratio, r.ratio_ci),
            f"{usd(r.result.cost_per_1k)} ({usd(r.top.cost_per_1k)})",
            _ci(r.saved, r.saved_ci),
            pct(r.random_saved),
            pct(r.result.escalation_rate),
        ]
        for r in rows
    ]
    ratio = rows[0].price_ratio
    return [
        f"## {cascade}",
        "",
        f"{first.n_calibration} calibration items, {first.n_held_out} held out. Top tier at {rows[0].top_price}; "
        f"price ratio r (its mean cost per request over the small tier's) {_ratio(ratio)}.",
        "",
        *md_table(header, body),
        "",
    ]


def _ratio(x: float) -> str:
    return num(x, 1) if math.isfinite(x) else "∞"


def write(rep: SuiteFrontier, out: Path, command: str) -> list[Path]:
    """`bfcl.md` and `bfcl.csv` (the frontier report's columns) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bfcl.md", out / "bfcl.csv"]
    paths[0].write_text(markdown(rep, command), encoding="utf-8")
    paths[1].write_text(csv_text([rep]), encoding="utf-8")
    return paths
