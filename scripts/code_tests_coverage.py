"""Which HumanEval prompts give `code_tests` examples to run, and how well it then predicts a right answer.

    .venv/bin/python scripts/code_tests_coverage.py [RUN_DIR]   (default: evals/results/humaneval)

Reads the committed run as it is (writes nothing). Per prompt it counts the examples the verifier
reads: ``>>>`` doctests, and examples stated in prose by form (a call with ``==``/``➞``/``->``/
"returns"..., "For x = ... the output should be ...", "Input: ... Output: ..."). Then it scores every
answer of the run with `code_tests` against the request the model was sent (the prompt only, as the
runner builds it), once with the prose examples off (before) and once on (after), and prints per tier
the AUROC of the score at predicting the grader's verdict over all items and over the items whose
prompt has no ``>>>``, beside the scores stored in the run; and the whole-sweep APGR of each
(`evals.sweep.summarize`, as `eval report` computes it).

The verifier sees only the prompt. To check the examples it reads are right, this script also runs
HumanEval's reference solution against them (``--no-audit`` skips it): a reference that fails an
example means the reader got that example wrong. The reference reaches this script, never a verifier.

On the committed run (evals/results/humaneval, graded by grader version 2) it printed, in short: 148 of 164
prompts give examples (70 ``>>>``, 80 in prose; 78 of the 88 without ``>>>``), 263 prose examples,
none failed by the reference; AUROC small 0.852 -> 0.963 (without ``>>>``: 0.577 -> 0.957), large
0.785 -> 0.887 (0.514 -> 0.853); whole-sweep APGR 0.938 -> 1.081.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from evals.data import HUMANEVAL, fetch, read_jsonl
from evals.measures import auroc
from evals.store import RunStore
from evals.suites import get_suite
from evals.sweep import ResultTable, load_table, summarize
from router.generation import Generation, GenerationRequest, Message
from verifiers.code_tests import CodeTestsVerifier
from verifiers.code_tests.stated import STATED_FORMS, stated_examples
from verifiers.code_tests.steps import doctest_steps

RUN = Path("evals/results/humaneval")
BEFORE, AFTER = "code_tests (>>> only)", "code_tests (>>> and prose)"


def request_for(messages: Sequence[Message]) -> GenerationRequest:
    # as evals.runner builds it: the operator's own data may run any doctest
    return GenerationRequest(messages=tuple(messages), metadata={"task": "code", "client_code": True})


def coverage(items: dict[str, GenerationRequest]) -> None:
    forms: Counter[str] = Counter()
    prompts: Counter[str] = Counter()
    without = [i for i, r in items.items() if ">>>" not in r.last_user_text()]
    for item_id, request in items.items():
        prompt = request.last_user_text()
        examples = stated_examples(prompt)
        doctests = [s for s in doctest_steps(prompt) if s.is_test]
        kinds = {e.form for e in examples}
        for e in examples:
            forms[f"{e.form} {e.separator}".strip()] += 1
        for kind in kinds:
            prompts[kind] += 1
        prompts["any example"] += bool(examples or doctests)
        prompts[">>> examples"] += bool(doctests)
        prompts["prose examples"] += bool(examples)
        if item_id in without:
            prompts["prose examples, no >>>"] += bool(examples)
    print(f"{len(items)} prompts, {len(without)} without >>>")
    keys = (">>> examples", "prose examples", *(f"prose examples: {f}" for f in STATED_FORMS))
    for key in (*keys, "prose examples, no >>>", "any example"):
        print(f"  prompts with {key:34s} {prompts[key.removeprefix('prose examples: ')]:4d}")
    print("  prose examples by form and separator:")
    for form, n in forms.most_common():
        print(f"    {n:4d}  {form}")


async def audit(items: dict[str, GenerationRequest]) -> None:
    rows = {r["task_id"]: r for r in read_jsonl(fetch(HUMANEVAL))}
    verifier = CodeTestsVerifier(doctest=False)
    wrong = []
    for item_id, request in items.items():
        row = rows[item_id]
        text = "```python\n" + row["prompt"] + row["canonical_solution"] + "```"
        score = await verifier.score(request, _generation(text))
        if score.reason != "no_tests" and score.value != 1.0:
            wrong.append(f"{item_id} ({score.reason})")
    print(f"prose examples the reference solution fails: {len(wrong)} prompt(s) {', '.join(wrong)}")


def _generation(text: str) -> Generation:
    return Generation(
        text=text, finish_reason="stop", prompt_tokens=0, completion_tokens=0, token_logprobs=None, latency_s=0.0
    )


async def rescore(table: ResultTable, items: dict[str, GenerationRequest]) -> ResultTable:
    before, after = CodeTestsVerifier(stated=False), CodeTestsVerifier()
    old: dict[str, list[float]] = {}
    new: dict[str, list[float]] = {}
    for item in table.items:
        request = items[item.id]
        for scores, verifier in ((old, before), (new, after)):
            values = []
            for outcome in item.tiers:
                score = await verifier.score(request, _generation(outcome.text))
                assert score.value is not None
                values.append(score.value)
            scores[item.id] = values
    return table.with_scores(BEFORE, old).with_scores(AFTER, new)


def report(table: ResultTable, items: dict[str, GenerationRequest]) -> None:
    without = {i for i, r in items.items() if ">>>" not in r.last_user_text()}
    labels = [label for label in ("code_tests", BEFORE, AFTER) if label in table.verifiers]
    print(f"\nAUROC at predicting a right answer ({table.run}: {len(table.items)} items, {len(without)} without >>>)")
    for t, tier in enumerate(table.tiers):
        outs = [(it.id, it.tiers[t]) for it in table.items]
        right = sum(o.correct for _, o in outs)
        print(f"  {tier.name} (accuracy {right}/{len(outs)})")
        for label in labels:
            cells = []
            for subset in (None, without):
                pairs = [(o.correct, o.scores[label]) for i, o in outs if subset is None or i in subset]
                area = auroc([c for c, _ in pairs], [float(v) for _, v in pairs if v is not None])
                cells.append("n/a" if area is None else f"{area:.3f}")
            stored = " (stored in the run)" if label == "code_tests" else ""
            print(f"    {label:28s} all {cells[0]}  without >>> {cells[1]}{stored}")
    print("\nwhole-sweep APGR (evals.sweep.summarize)")
    for label in labels:
        apgr = summarize(table, label).apgr
        print(f"    {label:28s} {'n/a' if apgr is None else f'{apgr:.3f}'}")


async def run(run_dir: Path, do_audit: bool) -> None:
    with RunStore(run_dir) as store:
        table = load_table(store)
    suite = get_suite(table.suite)
    if suite.name != "humaneval":
        raise SystemExit(f"{run_dir}: a {suite.name} run; this script reads HumanEval runs")
    items = {item.id: request_for(item.messages) for item in suite.load()}
    coverage(items)
    if do_audit:
        await audit(items)
    table = await rescore(table, items)
    report(table, items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", type=Path, default=RUN)
    parser.add_argument("--no-audit", action="store_true", help="do not run the reference solutions")
    args = parser.parse_args()
    asyncio.run(run(args.run, not args.no_audit))


if __name__ == "__main__":
    main()
