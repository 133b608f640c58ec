"""Whether an answer's tool calls are calls the client can make: each names a function it offered
(the one `tool_choice` names, if it names one), its arguments are a JSON object, and they match
that function's parameters schema. A request whose `tool_choice` is `required` or names a
function fails when the answer calls nothing, so the cascade escalates instead of returning text
the client's agent cannot use.

Two signs of a model looping fail it too: the same call twice in one answer, and an answer of
nothing but calls the conversation already has results for (what both Qwen2.5-Coder models do
when handed a result: they call again instead of answering).

It abstains when the request offers no tools (or `tool_choice` is `none`), and when the answer, as
`tool_choice: auto` allows, is plain text: whether that text is right is for the other verifiers.
The calls are read by `router.structured.tools.answer`, the reading the HTTP layer shows the client.
Arguments are checked by `verifiers.jsonschema_check`, the checker of response_format answers too
(the functions' schemas passed `router.structured.grammars.check_schema` with the request), in a worker
thread: a client's `pattern` may run to its time limit, and all the calls of one answer share one
pattern budget.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from router.generation import Generation, GenerationRequest, NamedTool, ToolCall, ToolSpec
from router.structured.tools import answer, decode_arguments
from verifiers.base import Score, VerifierContext
from verifiers.jsonschema_check import PatternBudget, first_error


@dataclass(frozen=True)
class ToolCallVerifier:
    name: str = "tool_call"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        if not request.offers_tools:
            return Score.abstain("the request offers no tools")
        found = answer(request, candidate)
        details: dict[str, Any] = {"tool_call": False, "calls": len(found.calls)}
        if found.malformed:
            return Score(0.0, f"malformed tool call: {found.malformed[0]}", details)
        choice = request.tool_choice
        if not found.calls:
            if choice == "required" or isinstance(choice, NamedTool):
                return Score(0.0, "no tool call, though tool_choice requires one", details)
            return Score.abstain("answered in text, without calling a tool")
        budget = PatternBudget()  # every call's arguments share one answer's pattern time
        offered: dict[str, ToolSpec] = {}
        for spec in request.tools:
            offered.setdefault(spec.name, spec)  # a repeated name: the first definition counts
        for i, call in enumerate(found.calls, 1):
            tool = offered.get(call.name)
            if tool is None:
                return Score(0.0, f"call {i} names {call.name[:64]!r}, which is not an offered function", details)
            if isinstance(choice, NamedTool) and call.name != choice.name:
                return Score(0.0, f"call {i} names {call.name!r}, but tool_choice names {choice.name!r}", details)
            arguments, why = decode_arguments(call.arguments)
            if why is not None:
                return Score(0.0, f"call {i} ({call.name}): arguments are {why}", details)
            if not isinstance(arguments, dict):
                return Score(0.0, f"call {i} ({call.name}): arguments are not a JSON object", details)
            if tool.checked is not None:
                error = await asyncio.to_thread(first_error, tool.checked, arguments, budget)
                if error is not None:
                    return Score(0.0, f"call {i} ({call.name}): arguments do not match the schema {error}", details)
        repeated = _repeats(request, found.calls)
        if repeated:
            return Score(0.0, repeated, details)
        details["tool_call"] = True
        return Score(1.0, f"{len(found.calls)} valid tool call(s)", details)


def _repeats(request: GenerationRequest, calls: tuple[ToolCall, ...]) -> str | None:
    """Why the calls look like a model looping rather than a plan: the same call twice in one
    answer, or nothing but calls whose results the conversation already holds (small models,
    given a result, often call again instead of answering)."""
    keys = [_key(c) for c in calls]
    if len(set(keys)) < len(keys):
        return "the same call more than once in one answer"
    answered = {m.tool_call_id for m in request.messages or () if m.role == "tool"}
    made = {_key(c) for m in request.messages or () for c in m.tool_calls if c.id in answered}
    if made and all(k in made for k in keys):
        return "repeats calls whose results the conversation already has"
    return None


def _key(call: ToolCall) -> tuple[str, str]:
    value, why = decode_arguments(call.arguments)
    return call.name, call.arguments if why is not None else json.dumps(value, sort_keys=True)


def make_tool_call(params: dict[str, Any], ctx: VerifierContext) -> ToolCallVerifier:
    return ToolCallVerifier(**params)
