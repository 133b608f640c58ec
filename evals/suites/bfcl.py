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
does for OpenAI's API, which refuses dots in names. The grader maps the names back. The tools are
part of the item (`Item.tools`) and of its identity: 100 of the 200 `multiple` items ask a `simple`
item's question among more functions, and must not be served that item's stored answer.

Grading follows BFCL's AST checker (`evals/bfcl_checks.py`): the answer's calls, read from its
text as the service reads them (`router.structured.tools.parse_tool_calls`), must be exactly the
wanted calls in number and functions (in any order for the parallel categories); every argument
given must be one the function declares, every required one must be given, and each value must be
one of the accepted values (an optional argument may be left out where "" is accepted).

The ground truth, as the v1 files write it, is one object per item: function name -> parameter ->
accepted values, with a repeated call's name suffixed (`spotify.play_1`, `spotify.play_2`, and
once `calculate_bmi 1`). `wanted_calls` reads it as the list of wanted calls the leaderboard's
later files write (`[{"spotify.play": {...}}, {"spotify.play": {...}}]`), each name resolved to an
offered function: the name itself, else without its suffix, else the one offered function whose
name ends in it (`simple_363` names `find_closest` for `restaurant_search.find_closest`). One
item's data puts a parameter beside the calls instead of inside one (`parallel_multiple_function_179`,
`"deck": [[], ""]`): it is given to the one wanted call whose function declares it, as the
leaderboard's later data does (its v1 checker counted it as a fifth call, so every model failed
the item). A name or parameter that cannot be placed so is refused, naming the item.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.bfcl_checks import api_name, grade_calls
from evals.data import read_jsonl
from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
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


_SUFFIX = re.compile(r"(.+)[ _]\d+")  # a repeated call's name in the v1 ground truth: `name_2`, `name 2`


def wanted_calls(truth: Any, functions: Sequence[dict[str, Any]], item: str) -> list[dict[str, Any]]:
    """An item's ground truth as its list of wanted calls (see the module docstring)."""
    if isinstance(truth, list):  # already the list the later files write
        return truth
    names = [f["name"] for f in functions]
    calls: list[dict[str, Any]] = []
    stray: dict[str, Any] = {}
    for key, params in truth.items():
        if not isinstance(params, dict):
            stray[key] = params
            continue
        calls.append({_resolve(key, names, item): params})
    for param, values in stray.items():
        homes = [
            c
            for c in calls
            for name, params in c.items()
            if param not in params and param in _declared(functions, name)
        ]
        if len(homes) != 1:
            raise ConfigError(f"bfcl {item}: ground truth entry {param!r} is neither a call nor one call's parameter")
        ((name, params),) = homes[0].items()
        homes[0][name] = {**params, param: values}
    return calls


def _resolve(key: str, names: list[str], item: str) -> str:
    if key in names:
        return key
    m = _SUFFIX.fullmatch(key)
    if m and m.group(1) in names:
        return m.group(1)
    ends = [n for n in names if n.endswith(f".{key}")]
    if len(ends) == 1:
        return ends[0]
    raise ConfigError(f"bfcl {item}: ground truth names {key!r}, which is none of the offered functions")


def _declared(functions: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    f = next(f for f in functions if f["name"] == name)
    props: dict[str, Any] = (f.get("parameters") or {}).get("properties") or {}
    return props


class BFCL(Suite):
    name = "bfcl"
    task = "structured"
    max_tokens = 384
    version = "1"
    source = "BFCL v1 non-live AST categories, gorilla 4a64db34, Apache-2.0 (evals/data/bfcl/PROVENANCE.md)"

    def __init__(self, root: Path = DATA, categories: tuple[str, ...] = ("simple", "multiple", "parallel")) -> None:
        self.root = root
        self.categories = categories

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for category in self.categories:
            truths = read_jsonl(self.root / "possible_answer" / CATEGORIES[category])
            answers = {r["id"]: r["ground_truth"] for r in truths}
            for row in read_jsonl(self.root / CATEGORIES[category]):
                functions = row["function"] if isinstance(row["function"], list) else [row["function"]]
                if len({api_name(f["name"]) for f in functions}) != len(functions):
                    raise ConfigError(f"bfcl {row['id']}: two offered functions have one name as sent")
                tools = tuple(
                    ToolSpec(
                        name=api_name(f["name"]),
                        description=f.get("description"),
                        parameters_json=json.dumps(json_schema(f["parameters"]), sort_keys=True),
                    )
                    for f in functions
                )
                truth = wanted_calls(answers[row["id"]], functions, row["id"])
                item = Item(
                    id=f"bfcl/{row['id']}",
                    messages=(Message("user", row["question"]),),
                    answer_key=AnswerKey(
                        reference={
                            "category": category,
                            "ground_truth": truth,
                            "functions": functions,
                        }
                    ),
                    group=category,
                    tools=tools,
                )
                items.append(item)
        return items

    def request(self, item: Item, request: GenerationRequest) -> GenerationRequest:
        return request.with_(tools=item.tools, tool_choice="auto")

    async def grade(self, item: Item, text: str) -> Grade:
        return grade_calls(text, item.answer_key.reference)
