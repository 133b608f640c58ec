"""BFCL's AST check of function calls, written for this project: is an answer's set of calls the one
a benchmark item wants, function by function and argument by argument?

The rules are the Berkeley Function Calling Leaderboard's (its `ast_checker`, read at gorilla
``4a64db34`` and at its current head, where they are unchanged), so a figure here means what the
leaderboard's does:

- **Calls.** The answer must make exactly as many calls as the item wants, each of an offered
  function. One call is wanted in `simple` and `multiple`; in the parallel categories the calls
  match the wanted ones in any order.
- **Arguments.** Every required parameter is given; every argument given is one the function
  declares *and* one the ground truth lists (an argument the schema has but the answer does not
  want is wrong, as a made-up default can be); a wanted argument left out is wrong unless ``""`` is
  among its accepted values (BFCL's mark of an optional one).
- **Types.** A value has the declared type (`integer` is not `boolean`), with one coercion: an
  integer where a `float` is declared. Where the accepted values are of another type than the
  declared one (the ground truth's way of writing a variable or a quirk of its data), a value of
  the accepted values' type is compared with them as it is.
- **Values.** Each value must be one of the accepted values. Strings compare after BFCL's
  standardisation (`standardize`: spaces and ``,./-_*^`` removed, lower-cased, ``'`` read as
  ``"``), so "April 1, 2024" and "april 1 2024" are the same; lists compare element by element, in
  order; a dict's keys must be the accepted dict's and each of its values one of that key's
  accepted values; a list of dicts compares dict by dict.

Where this checker differs from BFCL's code, it is more exact, never looser on what BFCL checks:
parallel calls are matched by a full bipartite matching (BFCL's greedy pass can pair a call with
the wrong wanted call and then fail an answer that has a valid pairing); the int-to-float coercion
and string standardisation apply inside lists and dicts too (BFCL's apply at the top level only,
and its nested type check fails `[1, 2]` where floats are declared although JSON has no other way
to write them); a dict's key whose accepted values include ``""`` may be left out (BFCL counts
keys; no item's data has such a key, so no grade differs); booleans never equal numbers.

Calls are read from the answer's text by the service's own reader
(`router.structured.tools.parse_tool_calls`, the reading a client is shown), so an answer is graded
on the calls the service would return: a malformed `<tool_call>` block fails the answer, prose
around tagged calls is content and does not, and untagged JSON followed by prose is no call at all
(the reader takes bare JSON as calls only when the answer is nothing else). Names come back as they
were sent: BFCL's dotted names with their dots as underscores (`api_name`); a call naming anything
else names a function that was not offered.

The `reference` is what `evals.suites.bfcl.BFCL.load` carries: the item's BFCL functions and its
ground truth as a list of wanted calls, ``[{function name: {parameter: [accepted values]}}]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from evals.grading import Grade
from router.structured.tools import parse_tool_calls

_PUNCT = re.compile(r"[ ,./\-_*^]")
SHOWN = 120  # characters of a value quoted in a grade's detail (an argument may be megabytes)
OPTIONAL = ""  # among accepted values: the argument may be left out


def api_name(name: str) -> str:
    """A BFCL function name as it is sent: OpenAI's API refuses dots in names."""
    return name.replace(".", "_")


def standardize(text: str) -> str:
    """A string as BFCL compares it (see the module docstring)."""
    return _PUNCT.sub("", text).lower().replace("'", '"')


Wanted = tuple[str, Mapping[str, Sequence[Any]]]  # (BFCL function name, parameter -> accepted values)


def wanted_calls(reference: Mapping[str, Any]) -> list[Wanted]:
    out: list[Wanted] = []
    for call in reference["ground_truth"]:
        ((name, params),) = call.items()
        out.append((name, params))
    return out


def grade_calls(text: str, reference: Mapping[str, Any]) -> Grade:
    """Whether `text` makes exactly the calls `reference` wants (see the module docstring)."""
    functions = {api_name(f["name"]): f for f in reference["functions"]}
    wanted = wanted_calls(reference)
    found = parse_tool_calls(text)
    shown = "; ".join(f"{c.name[:64]}({_short(c.arguments)})" for c in found.calls)[:400] or None
    if found.malformed:
        return Grade(False, shown, f"unreadable call: {found.malformed[0][:200]}")
    if not found.calls:
        return Grade(False, None, "empty answer" if not text.strip() else "no function call")
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i, call in enumerate(found.calls, 1):
        function = functions.get(call.name)
        if function is None:
            return Grade(False, shown, f"call {i} names {call.name[:64]!r}, which is not an offered function")
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError):
            return Grade(False, shown, f"call {i}'s arguments are not JSON")
        if not isinstance(args, dict):
            return Grade(False, shown, f"call {i}'s arguments are not an object")
        calls.append((function, args))
    if len(calls) != len(wanted):
        return Grade(False, shown, f"{len(calls)} call{'s' if len(calls) != 1 else ''}, wanted {len(wanted)}")
    why = [[_check_call(w, function, args) for function, args in calls] for w in wanted]
    unmatched = _unmatched(why)
    if unmatched is None:
        return Grade(True, shown)
    return Grade(False, shown, _explain(wanted, calls, why, unmatched))


def _unmatched(why: list[list[str | None]]) -> int | None:
    """A wanted call left without a call in a maximum matching of wanted calls to calls (a pair
    matches when its reason is None), or None when every wanted call has one."""
    owner: dict[int, int] = {}  # call -> wanted call

    def assign(w: int, seen: set[int]) -> bool:
        for c, reason in enumerate(why[w]):
            if reason is None and c not in seen:
                seen.add(c)
                if c not in owner or assign(owner[c], seen):
                    owner[c] = w
                    return True
        return False

    for w in range(len(why)):
        if not assign(w, set()):
            return w
    return None


def _explain(
    wanted: list[Wanted], calls: list[tuple[dict[str, Any], dict[str, Any]]], why: list[list[str | None]], w: int
) -> str:
    """Why wanted call `w` found no call: against a call of its function, if there is one."""
    name = wanted[w][0]
    if len(wanted) == 1:
        return str(why[0][0])
    same = [c for c, (function, _) in enumerate(calls) if function["name"] == name]
    if not same:
        return f"no call of {api_name(name)}, wanted as call {w + 1} of {len(wanted)}"
    reasons = "; ".join(f"call {c + 1}: {why[w][c] or 'matches another wanted call'}" for c in same[:3])
    return f"no call matches wanted call {w + 1} of {len(wanted)} ({api_name(name)}): {reasons}"


def _check_call(wanted: Wanted, function: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """None when the call is the wanted one, else why not."""
    name, accepted = wanted
    if function["name"] != name:
        return f"called {api_name(function['name'])}, wanted {api_name(name)}"
    schema = function.get("parameters") or {}
    declared: Mapping[str, Any] = schema.get("properties") or {}
    for param in schema.get("required") or ():
        if param not in args:
            return f"missing required argument {param!r}"
    for param, value in args.items():
        if param not in declared:
            return f"argument {param[:64]!r} is not a parameter of {api_name(name)}"
        if param not in accepted:
            return f"argument {param[:64]!r} is not among the arguments the item wants"
        reason = _check_value(param, value, declared[param], accepted[param])
        if reason is not None:
            return reason
    for param, values in accepted.items():
        if param not in args and OPTIONAL not in values:
            return f"missing argument {param!r}"
    return None


# ---- values --------------------------------------------------------------------------------------


def _is(value: Any, declared: str) -> bool:
    """Whether `value` (decoded JSON) has BFCL's declared type."""
    if isinstance(value, bool):
        return declared == "boolean"
    if isinstance(value, int):
        return declared in ("integer", "float")  # an integer where a float is declared: coerced
    return {
        float: declared == "float",
        str: declared in ("string", "any"),
        list: declared in ("array", "tuple"),
        dict: declared == "dict",
    }.get(type(value), False)


def _check_value(param: str, value: Any, spec: Mapping[str, Any], accepted: Sequence[Any]) -> str | None:
    declared = str(spec.get("type", "any"))
    given = [a for a in accepted if a != OPTIONAL]
    if not _is(value, declared):
        if given and type(value) is type(given[0]):
            # the ground truth's values are of another type than the schema's: compare with them as they are
            if any(_same(value, a, fold=False) for a in given):
                return None
            return _wrong(param, value, given)
        return f"argument {param!r} should be {declared}, got {_json_type(value)}: {_show(value)}"
    if declared in ("array", "tuple"):
        items = spec.get("items") or {}
        item_type = str(items.get("type", "any")) if isinstance(items, dict) else "any"
        for element in value:
            if items and item_type != "any" and not _is(element, item_type) and not _loosely_typed(element, given):
                return f"argument {param!r} holds {_json_type(element)} {_show(element)}, declared {item_type}"
        if item_type == "dict":
            ok = any(isinstance(a, list) and _same_dicts(value, a) for a in given)
        else:
            ok = any(_same(value, a, fold=True) for a in given)
        return None if ok else _wrong(param, value, given)
    if declared == "dict":
        return None if any(isinstance(a, dict) and _same_dict(value, a) for a in given) else _wrong(param, value, given)
    return None if any(_same(value, a, fold=True) for a in given) else _wrong(param, value, given)


def _loosely_typed(element: Any, given: Sequence[Any]) -> bool:
    """An element of the accepted lists' own type (where the data writes a variable's value)."""
    return any(isinstance(a, list) and a and type(a[0]) is type(element) for a in given)


def _same(value: Any, accepted: Any, *, fold: bool) -> bool:
    """Equal as JSON values, a boolean never a number; strings standardised where `fold`."""
    if isinstance(value, bool) or isinstance(accepted, bool):
        return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
    if isinstance(value, int | float) and isinstance(accepted, int | float):
        return value == accepted
    if isinstance(value, str) and isinstance(accepted, str):
        return standardize(value) == standardize(accepted) if fold else value == accepted
    if isinstance(value, list) and isinstance(accepted, list):
        return len(value) == len(accepted) and all(_same(v, a, fold=fold) for v, a in zip(value, accepted, strict=True))
    if isinstance(value, dict) and isinstance(accepted, dict):
        return value.keys() == accepted.keys() and all(_same(value[k], accepted[k], fold=fold) for k in value)
    return False


def _same_dict(value: Mapping[str, Any], accepted: Mapping[str, Any]) -> bool:
    """A dict argument against one accepted dict, whose keys hold lists of accepted values (or an
    accepted dict, for a dict inside it)."""
    for key, v in value.items():
        if key not in accepted:
            return False
        options = accepted[key]
        if isinstance(options, dict):
            if not (isinstance(v, dict) and _same_dict(v, options)):
                return False
        elif not any(_same(v, a, fold=True) for a in options if a != OPTIONAL):
            return False
    return all(
        key in value or (not isinstance(options, dict) and OPTIONAL in options) for key, options in accepted.items()
    )


def _same_dicts(value: Sequence[Any], accepted: Sequence[Any]) -> bool:
    return len(value) == len(accepted) and all(
        isinstance(v, dict) and isinstance(a, dict) and _same_dict(v, a) for v, a in zip(value, accepted, strict=True)
    )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}… ({len(text):,} characters)"


def _short(arguments: str) -> str:
    return arguments if len(arguments) <= SHOWN else f"{arguments[:SHOWN]}…"


def _wrong(param: str, value: Any, given: Sequence[Any]) -> str:
    options = ", ".join(_show(a) for a in given[:4]) + (", …" if len(given) > 4 else "")
    return f"argument {param!r} is {_show(value)}, accepted: {options or 'nothing but leaving it out'}"


# ---- the ground truth as an answer ---------------------------------------------------------------


def canonical_calls(reference: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ground truth's own answer: each wanted call with every argument at its first accepted
    value, as sent (`api_name`). ``""`` first means leaving the argument out, except for a required
    one, which takes its first other value; an argument the function does not declare (two items'
    data list one, with ``""`` accepted) is left out. Graded by `grade_calls`, it must be right (tested on
    every item); its length estimates the tokens of a right answer."""
    functions = {f["name"]: f for f in reference["functions"]}
    out = []
    for name, accepted in wanted_calls(reference):
        schema = functions[name].get("parameters") or {}
        required, declared = set(schema.get("required") or ()), schema.get("properties") or {}
        args: dict[str, Any] = {}
        for param, values in accepted.items():
            if param not in declared:
                continue
            pick = next((v for v in values if v != OPTIONAL), OPTIONAL) if param in required else values[0]
            if pick != OPTIONAL:
                args[param] = _first_of(pick)
        out.append((api_name(name), args))
    return out


def _first_of(value: Any) -> Any:
    """An accepted dict's own first accepted values (a dict argument's ground truth lists the
    accepted values of each of its keys)."""
    if isinstance(value, dict):
        return {k: _first_of(v) if isinstance(v, dict) else v[0] for k, v in value.items() if v and v[0] != OPTIONAL}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_first_of(v) for v in value]
    return value


def as_qwen_answer(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Calls written as Qwen2.5's chat template teaches a model to write them."""
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>" for n, a in calls
    )
