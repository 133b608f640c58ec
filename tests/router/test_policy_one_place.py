"""The decision rule is written once: no module under router/ or evals/ but router/policy.py
compares a score or a probability with a threshold. The live cascade and every offline policy
call `router.policy` (decide, skipped, accepts, answering_tiers) instead; a second comparison is
a second copy of the rule, free to drift from the first (tests/evals/test_parity*.py would catch
the drift only on the items they replay). Read from the source with `ast`, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULE = ROOT / "router" / "policy.py"


def _names(node: ast.AST) -> str:
    """Every identifier and attribute name in an expression, lower-cased, space-separated."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
    return " ".join(found).lower()


def comparisons(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not any(
            isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops
        ):
            continue
        sides = [_names(node.left), *(_names(c) for c in node.comparators)]
        scored = any(("score" in s or "probab" in s) for s in sides)
        against = any(("threshold" in s or "skip_below" in s) for s in sides)
        if scored and against:
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_only_the_policy_module_compares_a_score_with_a_threshold() -> None:
    found = [
        hit
        for pkg in ("router", "evals")
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if path != RULE
        for hit in comparisons(path)
    ]
    assert found == [], "the decision rule written again outside router/policy.py:\n" + "\n".join(found)


def test_the_check_sees_a_copy_of_the_rule(tmp_path: Path) -> None:
    copy = tmp_path / "copy.py"
    copy.write_text("def f(attempt, judge):\n    return attempt.score >= judge.threshold\n")
    assert len(comparisons(copy, tmp_path)) == 1
    assert comparisons(RULE)  # the rule itself is found where it lives
