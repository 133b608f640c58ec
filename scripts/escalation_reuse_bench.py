"""Escalation that reuses the rejected answer, against the sequential cascade, on real escalations.

    .venv/bin/python scripts/escalation_reuse_bench.py [--sample 12] [--seed 0] \
        [--config bench/escalation-reuse.toml] [--json docs/bench/escalation-reuse.json] \
        [--cross-tier REF]

Which requests: the committed eval runs' HumanEval and GSM8K items (evals/results/) on which the
small tier's answer was rejected, by the tier's configured verifiers and threshold as recorded
with the run and decided by the live cascade's own rule (evals.sweep.CascadePolicy), and the large
tier answered. A bounded sample of them, drawn by a seed, half from each suite.

How: the service itself, not the engine. `tierroute serve` runs the config twice side by side:
as given (`reuse_rejected = true`: the large tier takes the small tier's rejected tokens as its
first draft) and with `reuse_rejected = false` (the sequential cascade, the large tier answering
from scratch). Each item's prompt, exactly as the eval sent it, goes to both as a chat request,
one request at a time, the order of the two servers alternating from item to item so that load on
the machine falls on both alike. The config rejects every small answer, so both servers escalate
every item, as the committed runs did; the small step is the same work on both and is not what
is compared.

What: the large step's latency as the service reports it (the `tierroute` extension's large
attempt, `latency_ms`), per item and summed, the ratio reuse / sequential, and whether the two
greedy answers are identical (they must be). Beside them, for the record: whether each server's
small answer had as many tokens as the committed small answer, and whether the large answer is
the committed one (the runs' requests went through the engine directly; a difference there is
worth a look, not a failure of reuse).

An engine without `reuse_rejected` refuses the key: the script then measures the sequential
cascade alone and says so, so its baseline can be taken before the feature lands.

With `--cross-tier REF`, the small tier is also scored by the large one (a `cross_tier` verifier,
whose prefill of prompt + answer the escalation can reuse), and both servers reuse the rejected
answer: "before" runs the code of git revision REF (extracted with `git archive` into a temporary
directory, the repository untouched), in which the scoring pass and the reuse pass each read the
answer, and "shared" runs this checkout, in which the escalation starts where the scoring pass
left off. Per item: the scoring pass (the small attempt's `verify_ms`), the large step, and how
many of the answer's tokens the large tier took from the scoring pass (`drafts.scored`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUITES = ("humaneval", "gsm8k")
REUSE_ON = "reuse_rejected = true"
LARGE_TIER = '\n[[tiers]]\nname = "large"'
# the large tier reads every small answer; with the config's failing format check the answer is
# still rejected (the mean of 0 and the scoring), so every item escalates as before
CROSS_TIER = '\n[[tiers.verifiers]]\nname = "cross_tier"\nparams = { tier = "large", stat = "mean" }\n'
WARMUP_PROMPT = "Write a Python function that returns the square of a number."


@dataclass(frozen=True)
class Escalated:
    """One committed escalation: what the run asked, and what each tier answered."""

    suite: str
    id: str
    prompt_sha: str
    max_tokens: int
    small_text: str
    small_tokens: int
    small_score: float | None
    small_threshold: float
    large_text: str
    large_tokens: int


def escalated_items(runs_dir: Path, suites: Sequence[str], sample: int, seed: int) -> list[Escalated]:
    """A seeded sample of the runs' items the small tier was rejected on and the large tier
    answered, split evenly between the suites (the first suites take the remainder)."""
    from evals.store import RunStore
    from evals.sweep import CONFIG, CascadePolicy, load_table

    out: list[Escalated] = []
    for n, suite in enumerate(suites):
        share = sample // len(suites) + (1 if n < sample % len(suites) else 0)
        store = RunStore(runs_dir / suite)
        table = load_table(store, tiers=["small", "large"])
        small, large = (next(t for t in table.manifest["tiers"] if t["name"] == name) for name in ("small", "large"))
        cascade = CascadePolicy(CONFIG, (table.tiers[0].threshold,))
        shas = {e["id"]: e["prompt_sha"] for e in table.manifest["items"]}
        candidates = sorted(
            (it for it in table.items if CONFIG in it.tiers[0].scores and cascade.route(it).answered == 1),
            key=lambda it: it.id,
        )
        chosen = random.Random(f"{suite}:{seed}").sample(candidates, min(share, len(candidates)))
        for it in sorted(chosen, key=lambda it: it.id):
            first, second = it.tiers
            out.append(
                Escalated(
                    suite=suite,
                    id=it.id,
                    prompt_sha=shas[it.id],
                    max_tokens=min(int(small["max_tokens"]), int(large["max_tokens"])),
                    small_text=first.text,
                    small_tokens=first.completion_tokens,
                    small_score=first.scores[CONFIG],
                    small_threshold=table.tiers[0].threshold,
                    large_text=second.text,
                    large_tokens=second.completion_tokens,
                )
            )
    return out


def prompts_of(items: Sequence[Escalated], cache_dir: Path | None = None) -> dict[str, list[dict[str, str]]]:
    """Each item's messages as the run sent them, checked against the run's prompt hash."""
    from evals.suites import get_suite

    out: dict[str, list[dict[str, str]]] = {}
    for name in sorted({e.suite for e in items}):
        loaded = {it.id: it for it in get_suite(name).load(cache_dir)}
        for e in (e for e in items if e.suite == name):
            item = loaded[e.id]
            if item.prompt_sha != e.prompt_sha:
                raise SystemExit(f"{e.id}: the suite's prompt is not the one the committed run asked")
            out[e.id] = [{"role": m.role, "content": m.content} for m in item.messages]
    return out


def variant_configs(template: Path, into: Path) -> tuple[dict[str, Path], str | None]:
    """The config as given (reuse) and with reuse off (sequential); when this engine refuses the
    key, the sequential config without it, and why reuse cannot run."""
    from router.config import load_settings
    from router.errors import ConfigError

    text = template.read_text()
    if text.count(REUSE_ON) != 1:
        raise SystemExit(f"{template}: needs exactly one line '{REUSE_ON}' (the large tier's)")
    reuse, sequential = into / "reuse.toml", into / "sequential.toml"
    reuse.write_text(text)
    try:
        load_settings(reuse)
    except ConfigError as exc:
        if "reuse_rejected" not in str(exc):
            raise
        sequential.write_text(text.replace(REUSE_ON + "\n", "").replace(REUSE_ON, ""))
        return {"sequential": sequential}, f"this engine does not support reuse_rejected yet: {exc}"
    sequential.write_text(text.replace(REUSE_ON, "reuse_rejected = false"))
    return {"sequential": sequential, "reuse": reuse}, None


def cross_tier_configs(template: Path, into: Path) -> dict[str, Path]:
    """The config with the large tier scoring the small tier's answers, reuse on: one for the
    revision before (its code reads the answer twice) and one for this checkout (once)."""
    text = template.read_text()
    if text.count(REUSE_ON) != 1 or text.count(LARGE_TIER) != 1:
        raise SystemExit(f"{template}: needs one large tier, named 'large', with '{REUSE_ON}'")
    config = into / "cross-tier.toml"
    config.write_text(text.replace(LARGE_TIER, CROSS_TIER + LARGE_TIER))
    return {"before": config, "shared": config}


def checkout(ref: str, into: Path) -> Path:
    """The repository's files at git revision `ref`, extracted into `into` (no worktree, nothing
    in the repository changes)."""
    import io
    import subprocess
    import tarfile

    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def own_ledger(command: str, ledger: Path) -> str:
    """`command` (a `tierroute serve` line) on a SQLite ledger of its own: the servers run side by
    side, and one SQLite ledger serves one process (`router.ledger.serve_lock`)."""
    import shlex

    return shlex.join(["env", f"TIERROUTE_LEDGER__PATH={ledger}", *shlex.split(command)])


def command_in(tree: Path, command: str) -> str:
    """`command` (a `python -m router.cli ...` line) run from another tree's code: its directory
    first on the path (`-m` puts the working directory there)."""
    import shlex

    return shlex.join(["env", "-C", str(tree), f"PYTHONPATH={tree}", *shlex.split(command)])


def ask(client: Any, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One request through the service's cascade; the answer and the service's account of it."""
    from evals.runner import SEED, TEMPERATURE

    t0 = time.perf_counter()
    response = client.chat.completions.create(
        model="auto", messages=messages, max_tokens=max_tokens, temperature=TEMPERATURE, seed=SEED
    )
    wall_ms = (time.perf_counter() - t0) * 1000
    extension = (response.model_extra or {}).get("tierroute") or {}
    attempts = extension.get("attempts") or []
    by_tier = {a["tier"]: a for a in attempts}
    small, large = by_tier.get("small"), by_tier.get("large")
    return {
        "text": response.choices[0].message.content or "",
        "answered_by": extension.get("tier"),
        "escalated": small is not None and not small["accepted"] and large is not None,
        "small_tokens": None if small is None else small["completion_tokens"],
        "small_ms": None if small is None else small["latency_ms"],
        # the small answer's verification: with --cross-tier, the large tier's scoring pass
        "verify_ms": None if small is None else small["verify_ms"],
        "large_tokens": None if large is None else large["completion_tokens"],
        "large_ms": None if large is None else large["latency_ms"],
        "large_drafts": None if large is None else large["drafts"],
        "client_ms": round(wall_ms, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import openai

    from router.bench.drafts import draft_delta, read_draft_counters
    from router.bench.launch import free_port, serving
    from router.bench.output import print_progress
    from router.bench.spec import tierroute_command
    from router.bench.workload import Target

    items = escalated_items(Path(args.runs), args.suites, args.sample, args.seed)
    if not items:
        raise SystemExit("no escalated items in the runs")
    prompts = prompts_of(items)
    report: dict[str, Any] = {
        "tool": "scripts/escalation_reuse_bench.py",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": str(args.config),
        "runs": str(args.runs),
        "sample": args.sample,
        "seed": args.seed,
        "max_tokens_cap": args.max_tokens,
        "skipped": None,
        "items": [],
        "drafts": {},
    }
    report["cross_tier_before"] = args.cross_tier
    base, new = ("before", "shared") if args.cross_tier else ("sequential", "reuse")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trees: dict[str, Path] = {}
        if args.cross_tier:
            configs, skipped = cross_tier_configs(Path(args.config), Path(tmp)), None
            trees["before"] = checkout(args.cross_tier, Path(tmp) / "before")
        else:
            configs, skipped = variant_configs(Path(args.config), Path(tmp))
        report["skipped"] = skipped
        if skipped:
            print_progress(f"reuse: skipped, {skipped}")
        clients: dict[str, Any] = {}
        targets: dict[str, Target] = {}
        for name, config in configs.items():
            port = free_port()
            launch = own_ledger(tierroute_command(config, port), Path(tmp) / f"{name}-ledger.sqlite3")
            if name in trees:
                launch = command_in(trees[name], launch)
            target = Target(f"http://127.0.0.1:{port}/v1", name, launch=launch)
            live = stack.enter_context(serving(target, start_timeout_s=args.launch_timeout))
            print_progress(f"[{name}] {live.url} (pid {live.pid})")
            client = stack.enter_context(
                openai.OpenAI(base_url=live.url, api_key="not-needed", max_retries=0, timeout=args.timeout)
            )
            ask(client, [{"role": "user", "content": WARMUP_PROMPT}], 8)
            clients[name], targets[name] = client, live
        names = list(clients)
        before = {name: asyncio.run(read_draft_counters(t)) for name, t in targets.items()}
        for i, e in enumerate(items):
            max_tokens = min(e.max_tokens, args.max_tokens) if args.max_tokens else e.max_tokens
            row: dict[str, Any] = {
                **{k: v for k, v in asdict(e).items() if k not in ("small_text", "large_text")},
                "max_tokens": max_tokens,
            }
            for name in names if i % 2 == 0 else reversed(names):
                row[name] = ask(clients[name], prompts[e.id], max_tokens)
            if new in row:
                row["identical"] = row[new]["text"] == row[base]["text"]
                row["large_ms_ratio"] = _ratio(row[new]["large_ms"], row[base]["large_ms"])
            for name in names:
                got = row[name]
                got["small_tokens_match_committed"] = got["small_tokens"] == e.small_tokens
                got["large_matches_committed"] = got["text"] == e.large_text
                got["text"] = got["text"][:200]  # enough to tell answers apart in the JSON
            report["items"].append(row)
            print_progress(_line(row, base, new))
        # the service's own count of the draft tokens it took from rejected answers, and accepted
        for name, t in targets.items():
            after = asyncio.run(read_draft_counters(t))
            report["drafts"][name] = None if after is None else draft_delta(before[name] or {}, after)
    report["summary"] = summarize(report["items"], base, new)
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def _line(row: dict[str, Any], base: str = "sequential", new: str = "reuse") -> str:
    first = row[base]
    text = f"{row['id']}: {base} large {first['large_ms']} ms ({first['large_tokens']} tokens)"
    if new in row:
        text += f", {new} {row[new]['large_ms']} ms, identical {row['identical']}"
    return text


def summarize(rows: Sequence[dict[str, Any]], base: str = "sequential", new: str = "reuse") -> dict[str, Any]:
    """The large step summed over the items and item by item, `new` against `base` (reuse
    against sequential; with --cross-tier, shared prefill against the revision before)."""
    escalated = [r for r in rows if all(r[n]["escalated"] for n in (base, new) if n in r)]
    out: dict[str, Any] = {
        "items": len(rows),
        "escalated_on_every_server": len(escalated),
        f"{base}_large_ms_total": round(sum(r[base]["large_ms"] or 0 for r in rows), 1),
        "small_tokens_match_committed": sum(r[base]["small_tokens_match_committed"] for r in rows),
        "large_matches_committed": sum(r[base]["large_matches_committed"] for r in rows),
    }
    compared = [r for r in rows if new in r]
    if compared:
        total = sum(r[new]["large_ms"] or 0 for r in compared)
        ratios = [r["large_ms_ratio"] for r in compared if r["large_ms_ratio"] is not None]

        def summed(side: str, *parts: str) -> float:
            return sum(sum(r[side].get(p) or 0 for p in parts) for r in compared)

        out.update(
            {
                f"{new}_large_ms_total": round(total, 1),
                "large_ms_ratio_of_totals": _ratio(total, out[f"{base}_large_ms_total"]),
                "large_ms_ratio_median": round(statistics.median(ratios), 3) if ratios else None,
                # the request: the (unchanged) small step plus the large one
                "request_ms_ratio_of_totals": _ratio(
                    summed(new, "small_ms", "large_ms"), summed(base, "small_ms", "large_ms")
                ),
                "identical": sum(r["identical"] for r in compared),
            }
        )
        if base == "before":  # --cross-tier: the scoring pass, and the escalation it now serves too
            out.update(
                {
                    "before_verify_ms_total": round(summed(base, "verify_ms"), 1),
                    "shared_verify_ms_total": round(summed(new, "verify_ms"), 1),
                    "scoring_and_large_ms_ratio_of_totals": _ratio(
                        summed(new, "verify_ms", "large_ms"), summed(base, "verify_ms", "large_ms")
                    ),
                    "large_tokens_total": sum(r[new]["large_tokens"] or 0 for r in compared),
                    "scored_tokens_taken": sum(
                        ((r[new]["large_drafts"] or {}).get("scored") or {}).get("accepted", 0) for r in compared
                    ),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--config", default=str(REPO / "bench" / "escalation-reuse.toml"), help="the reuse config")
    p.add_argument("--runs", default=str(REPO / "evals" / "results"), help="the committed eval runs")
    p.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    p.add_argument("--sample", type=int, default=12, help="items in all, split evenly between the suites")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=0, help="cap each request's max_tokens (0: the run's own)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    p.add_argument("--launch-timeout", type=float, default=300.0)
    p.add_argument(
        "--cross-tier",
        metavar="REF",
        help="score the small answers with the large tier, and compare this checkout against git revision REF",
    )
    p.add_argument("--json", default=str(REPO / "docs" / "bench" / "escalation-reuse.json"))
    args = p.parse_args(argv)
    if args.sample < 1:
        p.error("--sample must be at least 1")
    report = run(args)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    compared = [r for r in report["items"] if "identical" in r]
    escalated = report["summary"]["escalated_on_every_server"] == len(report["items"])
    return 0 if escalated and all(r["identical"] for r in compared) else 1


if __name__ == "__main__":
    sys.exit(main())
