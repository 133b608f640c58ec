"""Every place of a request that a tier is sent, as texts a guard can scan, and the same request
with some of those texts replaced.

The places: the prompt (completions), each message's content (system prompts, earlier turns and
tool results included), each earlier tool call's arguments, and each offered tool's description
and parameters schema. JSON texts (arguments, schemas) are read as JSON and each string inside is a
place of its own, so a redaction replaces a value and the JSON stays JSON; one that does not parse
is scanned and replaced as plain text. The Responses and Messages surfaces arrive here as their
chat twin (`router.api.surfaces`): their `instructions`, `system`, `input` items and tool blocks
are these same places. Not scanned: a `response_format` schema (the shape of the answer, and a
redaction would change what the answer must be), function names, and message roles.

`joined` is all places in one text, a space between each, so a detector also sees a value split
across two places (`"4111 1111"` in one message, `"1111 1111"` in the next); `Places.split` maps a
finding in it back to the piece of each place it covers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from router.generation import GenerationRequest, ToolSpec

_SEP = " "


@dataclass(frozen=True)
class Place:
    """Where one text sits: ("prompt",), ("message", i), ("arguments", i, j, *path),
    ("tool_description", k), ("tool_parameters", k, *path): a JSON path is the keys and indexes
    down to one string."""

    where: tuple[Any, ...]
    text: str


def _json_strings(raw: str, head: tuple[Any, ...]) -> list[Place]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return [Place(head, raw)]
    out: list[Place] = []

    def walk(v: Any, path: tuple[Any, ...]) -> None:
        if isinstance(v, str):
            out.append(Place(head + path, v))
        elif isinstance(v, dict):
            for k, item in v.items():
                walk(item, (*path, k))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                walk(item, (*path, i))

    walk(value, ("json",))
    return out


def places(request: GenerationRequest) -> list[Place]:
    """The request's texts, in the order a model reads them."""
    found: list[Place] = []
    for k, tool in enumerate(request.tools):
        if tool.description:
            found.append(Place(("tool_description", k), tool.description))
        if tool.parameters_json:
            found.extend(_json_strings(tool.parameters_json, ("tool_parameters", k)))
    if request.prompt is not None:
        found.append(Place(("prompt",), request.prompt))
    for i, m in enumerate(request.messages or ()):
        if m.content:
            found.append(Place(("message", i), m.content))
        for j, call in enumerate(m.tool_calls):
            found.extend(_json_strings(call.arguments, ("arguments", i, j)))
    return [p for p in found if p.text]


class Places:
    """A request's places joined into one text, and the way back from its spans."""

    def __init__(self, request: GenerationRequest) -> None:
        self.items = places(request)
        self.starts: list[int] = []
        at = 0
        for p in self.items:
            self.starts.append(at)
            at += len(p.text) + len(_SEP)
        self.joined = _SEP.join(p.text for p in self.items)

    def split(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(place index, start, end) of each place's part of joined[start:end]."""
        out = []
        for i, (p, s) in enumerate(zip(self.items, self.starts, strict=True)):
            lo, hi = max(start, s), min(end, s + len(p.text))
            if lo < hi:
                out.append((i, lo - s, hi - s))
        return out


def rewritten(request: GenerationRequest, new_texts: dict[tuple[Any, ...], str]) -> GenerationRequest:
    """The request with the text at each place in `new_texts` replaced (places as `places` names
    them); every other field as it was."""
    if not new_texts:
        return request
    by_head: dict[tuple[Any, ...], dict[tuple[Any, ...], str]] = {}
    for where, text in new_texts.items():
        if "json" in where:
            cut = where.index("json")
            by_head.setdefault(where[:cut], {})[where[cut + 1 :]] = text
        else:
            by_head.setdefault(where, {})[()] = text

    def json_text(raw: str, head: tuple[Any, ...]) -> str:
        edits = by_head.get(head)
        if not edits:
            return raw
        if () in edits:  # it did not parse: replaced as plain text
            return edits[()]
        value = json.loads(raw)
        for path, text in edits.items():
            value = _set(value, path, text)
        return json.dumps(value, ensure_ascii=False)

    changes: dict[str, Any] = {}
    if request.tools:
        tools = []
        for k, tool in enumerate(request.tools):
            desc = by_head.get(("tool_description", k), {}).get((), tool.description)
            params = tool.parameters_json
            if params is not None:
                params = json_text(params, ("tool_parameters", k))
            tools.append(_tool(tool, desc, params))
        changes["tools"] = tuple(tools)
    if request.prompt is not None and ("prompt",) in by_head:
        changes["prompt"] = by_head[("prompt",)][()]
    if request.messages is not None:
        messages = []
        for i, m in enumerate(request.messages):
            content = by_head.get(("message", i), {}).get((), m.content)
            calls = tuple(
                dataclasses.replace(c, arguments=json_text(c.arguments, ("arguments", i, j)))
                for j, c in enumerate(m.tool_calls)
            )
            messages.append(dataclasses.replace(m, content=content, tool_calls=calls))
        changes["messages"] = tuple(messages)
    return request.with_(**changes)


def _tool(tool: ToolSpec, description: str | None, parameters_json: str | None) -> ToolSpec:
    if description == tool.description and parameters_json == tool.parameters_json:
        return tool
    # the schema a non-strict function is checked against is the loosened copy of its parameters;
    # descriptions inside it change with them (the loosening never reads descriptions)
    checked = tool.checked_json
    if checked is not None and parameters_json != tool.parameters_json and tool.parameters_json is not None:
        checked = _same_edits(tool.parameters_json, parameters_json, checked)
    return dataclasses.replace(tool, description=description, parameters_json=parameters_json, checked_json=checked)


def _same_edits(before: str, after: str | None, other: str) -> str:
    """`other` with each string of `before` that changed in `after` changed alike (by value)."""
    if after is None:
        return other
    changed: dict[str, str] = {}
    for a, b in zip(_json_strings(before, ()), _json_strings(after, ()), strict=False):
        if a.text != b.text:
            changed[a.text] = b.text
    value = json.loads(other)

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return changed.get(v, v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return json.dumps(walk(value), ensure_ascii=False)


def _set(value: Any, path: tuple[Any, ...], text: str) -> Any:
    if not path:
        return text
    head, rest = path[0], path[1:]
    value[head] = _set(value[head], rest, text)
    return value
