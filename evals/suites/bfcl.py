"""BFCL v1: narrow function calling, graded on the call's structure and arguments.

The Berkeley Function Calling Leaderboard's non-live AST categories (v1, gorilla at
``4a64db34``): `simple` (400 items, one function offered, one call wanted), `multiple` (200, two to
four functions offered, one call), `parallel` (200, one function called several times) and
`parallel_multiple` (200). The items, their functions and the accepted values of every argument are
the leaderboard's (Apache-2.0), read from ``evals/data/bfcl`` (PROVENANCE.md beside it).

Each item is asked as a chat request with the functions as OpenAI `tools` (`tool_choice: auto`,
as a caller leaves it). BFCL's schemas are written in Python's words; they are sent in JSON
Schema's (`dict` -> `object`, `float` -> `number`, `tuple` -> `array`, `any` -> no type), and a
dotted function name (`math.factorial`) is sent with its dots as underscores, as the leaderboard
does for OpenAI's API, which refuses dots in names. The grader maps the names back.

Grading follows BFCL's AST checker (`evals/bfcl_checks.py`): the answer's calls, read from its
text as the service reads them (`router.structured.tools.parse_tool_calls`), must be exactly the
wanted calls in number and functions (in any order for the parallel categories); every argument
given must be one the function declares, every required one must be given, and each value must be
one of the accepted values (an optional argument may be left out where "" is accepted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.data import read_jsonl
from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite
from router.generation import GenerationRequest, Message, ToolSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "bfcl"
CATEGORIES = {
    "simple": "gorilla_openfunctions_v1_test_simple.json",
    "multiple": "gorilla_openfunctions_v1_test_multiple_function.json",
    "parallel": "gorilla_openfunctions_v1_test_parallel_function.json",
    "parallel_multiple": "gorilla_openfunctions_v1_test_parallel_multiple_function.json",
}
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "bool": "boolean", "str": "string"}


def json_schema(node: Any) -> Any:
    """A BFCL parameter schema in JSON Schema's words (see the module docstring)."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            out[key] = _TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(v) for name, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


def api_name(name: str) -> str:
    return name.replace(".", "_")


class BFCL(Suite):
    name = "bfcl"
    task = "structured"
    max_tokens = 384
    version = "1"
    source = "BFCL v1 non-live AST categories, gorilla 4a64db34, Apache-2.0 (evals/data/bfcl/PROVENANCE.md)"

    def __init__(self, root: Path = DATA, categories: tuple[str, ...] = ("simple", "multiple", "parallel")) -> None:
        self.root = root
        self.categories = categories
        self._tools: dict[str, tuple[ToolSpec, ...]] = {}

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for category in self.categories:
            truths = read_jsonl(self.root / "possible_answer" / CATEGORIES[category])
            answers = {r["id"]: r["ground_truth"] for r in truths}
            for row in read_jsonl(self.root / CATEGORIES[category]):
                functions = row["function"] if isinstance(row["function"], list) else [row["function"]]
                tools = tuple(
                    ToolSpec(
                        name=api_name(f["name"]),
                        description=f.get("description"),
                        parameters_json=json.dumps(json_schema(f["parameters"]), sort_keys=True),
                    )
                    for f in functions
                )
                truth = answers[row["id"]]
                item = Item(
                    id=f"bfcl/{row['id']}",
                    messages=(Message("user", row["question"]),),
                    answer_key=AnswerKey(
                        reference={
                            "category": category,
                            "ground_truth": truth if isinstance(truth, list) else [truth],
                            "functions": functions,
                        }
                    ),
                    group=category,
                )
                self._tools[item.id] = tools
                items.append(item)
        return items

    def request(self, item: Item, request: GenerationRequest) -> GenerationRequest:
        if not self._tools:
            self.load()
        return request.with_(tools=self._tools[item.id], tool_choice="auto")

    async def grade(self, item: Item, text: str) -> Grade:
        from evals.bfcl_checks import grade_calls

        return grade_calls(text, item.answer_key.reference)
