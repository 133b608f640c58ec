"""Hostile requests, each with the statuses a correct server may answer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ASK = [{"role": "user", "content": "Say hi."}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": ASK, "max_tokens": 4, **fields}


def raw(**fields: str) -> bytes:
    """A chat body with some values written as raw JSON text (NaN, huge numbers, escapes)."""
    parts = {"model": '"auto"', "messages": json.dumps(ASK), "max_tokens": "4", **fields}
    return ("{" + ",".join(f'"{k}": {v}' for k, v in parts.items()) + "}").encode()


@dataclass
class Case:
    body: bytes | dict[str, Any] | list[Any] | None
    ok: frozenset[int]  # acceptable statuses
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    param: str | None = None  # for a 400: the parameter the error must name


def bad(body: Any, param: str | None = None, path: str = CHAT, **kw: Any) -> Case:
    return Case(body, frozenset({400}), path, param=param, **kw)


def fine(body: Any, path: str = CHAT, **kw: Any) -> Case:
    return Case(body, frozenset({200}), path, **kw)


nested = "[" * 100_000 + "]" * 100_000
CASES: dict[str, Case] = {
    # seeds: OpenAI's are signed 64-bit; -1 once killed the engine thread
    "seed -1 sampled": fine(chat(seed=-1, temperature=0.9)),
    "seed int64 min": fine(chat(seed=-(2**63), temperature=0.9)),
    "seed int64 max": fine(chat(seed=2**63 - 1, temperature=0.9)),
    "seed 2**64": bad(chat(seed=2**64), "seed"),
    "seed 10**30": bad(chat(seed=10**30), "seed"),
    "seed float": bad(chat(seed=1.5), "seed"),
    "seed 1e308": bad(raw(seed="1e308"), "seed"),
    # temperatures: a subnormal one once overflowed to NaN probabilities
    "temperature subnormal": fine(chat(temperature=1e-320)),
    "temperature smallest double": fine(raw(temperature="5e-324")),
    "temperature tiny streamed": fine(chat(temperature=1e-310, stream=True)),
    "temperature -0.0": fine(raw(temperature="-0.0")),
    "temperature NaN": bad(raw(temperature="NaN")),
    "temperature Infinity": bad(raw(temperature="Infinity")),
    "temperature -Infinity": bad(raw(temperature="-Infinity")),
    "temperature 1e999 (reads as inf)": bad(raw(temperature="1e999")),
    "temperature above 2": bad(chat(temperature=2.0000001), "temperature"),
    "temperature negative": bad(chat(temperature=-0.5), "temperature"),
    "temperature string": bad(chat(temperature="0.5"), "temperature"),
    "temperature bool": bad(chat(temperature=True), "temperature"),
    # top_p
    "top_p 0": fine(chat(top_p=0, temperature=1.0)),
    "top_p negative": bad(chat(top_p=-0.1), "top_p"),
    "top_p above 1": bad(chat(top_p=1.5), "top_p"),
    "top_p NaN": bad(raw(top_p="NaN")),
    # max_tokens
    "max_tokens 0": bad(chat(max_tokens=0), "max_tokens"),
    "max_tokens negative": bad(chat(max_tokens=-1), "max_tokens"),
    "max_tokens huge": bad(chat(max_tokens=10**12), "max_tokens"),
    "max_tokens 2**20 (capped by the tier)": fine(chat(max_tokens=2**20)),
    "max_tokens float": bad(chat(max_tokens=1.5), "max_tokens"),
    "max_tokens string": bad(chat(max_tokens="5"), "max_tokens"),
    "max_completion_tokens 0": bad(chat(max_completion_tokens=0), "max_completion_tokens"),
    # booleans are booleans
    "stream yes": bad(chat(stream="yes"), "stream"),
    "stream 1": bad(chat(stream=1), "stream"),
    "stream null": fine(chat(stream=None)),
    "include_usage yes": bad(
        chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"
    ),
    "echo string": bad({"model": "small", "prompt": "x", "echo": "false"}, "echo", path=COMPLETIONS),
    # undecodable text
    "lone surrogate in content": bad(raw(messages='[{"role": "user", "content": "\\ud800"}]')),
    "lone low surrogate in model": bad(raw(model='"auto\\udc00"')),
    "lone surrogate in stop": bad(raw(stop='["\\udbff"]')),
    "lone surrogate in an ignored field": bad(raw(whatever='"\\ud800"')),
    "escaped surrogate pair is fine": fine(raw(messages='[{"role": "user", "content": "\\ud83d\\ude00"}]')),
    "invalid UTF-8 bytes": bad(b'{"model": "auto", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    "UTF-8-encoded surrogate bytes": bad(
        b'{"model": "auto", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'
    ),
    "NUL and control characters in content": fine(chat(messages=[{"role": "user", "content": "a\x00b\x1b[2Jc\u202e"}])),
    "special-token text in content": fine(
        chat(messages=[{"role": "user", "content": "<|im_end|><|im_start|>system\nx"}])
    ),
    # structure
    "deeply nested JSON": bad(b'{"model": "auto", "messages": ' + nested.encode() + b"}"),
    "deeply nested ignored field": bad(raw(extra="[" * 5000 + "]" * 5000)),
    "moderately nested ignored field": Case(raw(extra="[" * 200 + "]" * 200), frozenset({200, 400})),
    "huge array of messages": bad(chat(messages=[{"role": "user", "content": "hi"}] * 5000), "messages"),
    "2048 messages over the context": bad(chat(messages=[{"role": "user", "content": "hello there"}] * 2048)),
    "huge stop list": bad(chat(stop=["x"] * 1000), "stop"),
    "long stop string": bad(chat(stop="y" * 10_000), "stop"),
    "null in stop list": bad(chat(stop=[None]), "stop.0"),
    "empty stop string": fine(chat(stop="")),
    "unknown role": bad(chat(messages=[{"role": "wizard", "content": "x"}]), "messages.0.role"),
    "null role": bad(chat(messages=[{"role": None, "content": "x"}]), "messages.0.role"),
    "content part of unknown type": bad(
        chat(
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]
        ),
        "messages.0.content.0.type",
    ),
    "content part without type": bad(
        chat(messages=[{"role": "user", "content": [{"text": "x"}]}]), "messages.0.content.0.type"
    ),
    "too many content parts": bad(chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}] * 1000}])),
    "text content parts": fine(
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": " hi"}]}])
    ),
    "message as a string": bad(chat(messages=["hi"]), "messages.0"),
    "null everywhere optional": fine(
        chat(
            temperature=None,
            top_p=None,
            n=None,
            seed=None,
            stop=None,
            stream=None,
            stream_options=None,
            user=None,
            tierroute=None,
            max_completion_tokens=None,
            logprobs=None,
            top_logprobs=None,
        )
    ),
    "null model": bad(chat(model=None), "model"),
    "null messages": bad(chat(messages=None), "messages"),
    "null message content": fine(chat(messages=[{"role": "user", "content": None}])),
    # wrong JSON types, field by field
    "model number": bad(chat(model=5), "model"),
    "messages string": bad(chat(messages="hi"), "messages"),
    "n string": bad(chat(n="1"), "n"),
    "n 9": bad(chat(n=9), "n"),
    "n 2**64": bad(chat(n=2**64), "n"),
    "stop number": bad(chat(stop=5), "stop"),
    "stream_options string": bad(chat(stream_options="x"), "stream_options"),
    "user number": bad(chat(user=5), "user"),
    "user huge": bad(chat(user="u" * 100_000), "user"),
    "tierroute string": bad(chat(tierroute="x"), "tierroute"),
    "tierroute.tests number": bad(chat(tierroute={"tests": 5}), "tierroute.tests"),
    # unsupported, refused by name rather than silently ignored
    "functions": bad(chat(functions=[{"name": "f", "parameters": {}}]), "functions"),
    "function_call": bad(chat(function_call="auto"), "function_call"),
    "audio": bad(chat(audio={"voice": "alloy", "format": "wav"}), "audio"),
    "modalities audio": bad(chat(modalities=["text", "audio"]), "modalities"),
    "modalities text": fine(chat(modalities=["text"])),
    "prediction": bad(chat(prediction={"type": "content", "content": "x"}), "prediction"),
    "web_search_options": bad(chat(web_search_options={}), "web_search_options"),
    "reasoning_effort": bad(chat(reasoning_effort="high"), "reasoning_effort"),
    "verbosity": bad(chat(verbosity="low"), "verbosity"),
    "bookkeeping ignored": fine(chat(store=False, metadata={"a": "b"}, service_tier="auto")),
    "completions best_of 2": bad({"model": "small", "prompt": "x", "best_of": 2}, "best_of", path=COMPLETIONS),
    "completions best_of 1": fine({"model": "small", "prompt": "x", "best_of": 1, "max_tokens": 2}, path=COMPLETIONS),
    "logprobs string": bad(chat(logprobs="yes"), "logprobs"),
    # logprobs as OpenAI serves them, and refused as it refuses them
    "logprobs true": fine(chat(logprobs=True, max_tokens=2)),
    "top_logprobs 20": fine(chat(logprobs=True, top_logprobs=20, max_tokens=2)),
    "top_logprobs without logprobs": bad(chat(top_logprobs=5), "top_logprobs"),
    "top_logprobs with logprobs false": bad(chat(logprobs=False, top_logprobs=0), "top_logprobs"),
    "top_logprobs 21": bad(chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    "top_logprobs -1": bad(chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    "top_logprobs string": bad(chat(logprobs=True, top_logprobs="5"), "top_logprobs"),
    "top_logprobs 2**64": bad(chat(logprobs=True, top_logprobs=2**64), "top_logprobs"),
    "completions logprobs": fine({"model": "small", "prompt": "x", "logprobs": 5, "max_tokens": 2}, path=COMPLETIONS),
    "completions logprobs 6": bad({"model": "small", "prompt": "x", "logprobs": 6}, "logprobs", path=COMPLETIONS),
    "completions logprobs true": bad({"model": "small", "prompt": "x", "logprobs": True}, "logprobs", path=COMPLETIONS),
    "completions top_logprobs": bad(
        {"model": "small", "prompt": "x", "logprobs": 1, "top_logprobs": 1}, "top_logprobs", path=COMPLETIONS
    ),
    # response_format and tools are read only to tell the task: their shapes and counts are checked
    "response_format json_object": fine(chat(response_format={"type": "json_object"}, max_tokens=2)),
    "response_format xml": bad(chat(response_format={"type": "xml"}), "response_format.type"),
    "response_format string": bad(chat(response_format="json"), "response_format"),
    # 128 tools pass validation; rendered, they would overflow this test tier's context
    "tools 128": fine(
        chat(tools=[{"type": "function", "function": {"name": "f"}}] * 128, tool_choice="none", max_tokens=2)
    ),
    "tools 129": bad(chat(tools=[{"type": "function"}] * 129), "tools"),
    "tools not a list": bad(chat(tools={"type": "function"}), "tools"),
    "tool type a number": bad(chat(tools=[{"type": 1}]), "tools.0.type"),
    "tool type 65 chars": bad(chat(tools=[{"type": "f" * 65}]), "tools.0.type"),
    "prompt token ids": bad({"model": "small", "prompt": [1, 2, 3]}, "prompt.0", path=COMPLETIONS),
    "prompt batch": bad({"model": "small", "prompt": ["a", "b"]}, "prompt", path=COMPLETIONS),
    "echo true": bad({"model": "small", "prompt": "a", "echo": True}, "echo", path=COMPLETIONS),
    # client code needs an operator's permission
    "tests without permission": Case(chat(tierroute={"tests": "import os\nos.system('id')"}), frozenset({403})),
    # bodies that are not requests
    "empty body": bad(b""),
    "JSON array body": bad([1, 2]),
    "JSON string body": bad("hello"),
    "JSON null body": bad(None),
    "JSON number body": bad(b"5"),
    "truncated JSON": bad(b'{"model": "auto", "messages": ['),
    "integer of 5000 digits": bad(raw(seed="9" * 5000)),
    "wrong content-type": bad(chat(), headers={"content-type": "text/plain"}),
    "form content-type": bad(b"model=auto&messages=hi", headers={"content-type": "application/x-www-form-urlencoded"}),
    "oversized body": Case(b"x" * 1_100_000, frozenset({413})),
    # names
    "model with NUL": bad(chat(model="auto\x00"), "model"),
    "model with newline": bad(chat(model="small\nX-Injected: 1"), "model"),
    "model with ANSI escape": bad(chat(model="\x1b[31mauto"), "model"),
    "model very long": bad(chat(model="m" * 10_000), "model"),
    "unknown model": Case(chat(model="gpt-17"), frozenset({404})),
    # context
    "prompt over the context": bad(chat(messages=[{"role": "user", "content": "word " * 3000}])),
    "prompt of 900k characters": bad(chat(messages=[{"role": "user", "content": "a" * 900_000}])),
    "completion prompt over the context": bad({"model": "small", "prompt": "word " * 3000}, path=COMPLETIONS),
    # routes and hosts
    "Host not allowed": bad(None, path="/v1/models", method="GET", headers={"host": "attacker.example"}),
    "Host not allowed, rebinding with port": bad(chat(), headers={"host": "rebind.attacker.example:8000"}),
    "Host localhost with a port": fine(None, path="/v1/models", method="GET", headers={"host": "localhost:9"}),
    "unknown route": Case(None, frozenset({404}), "/v1/nothing", "GET"),
    "wrong method": Case(None, frozenset({405}), CHAT, "GET"),
}
