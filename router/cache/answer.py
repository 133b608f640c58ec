"""What the cache stores of an answer, and the checks a stored row passes before it is served.

An entry is the answer as the client received it, less what belongs to one request (its id, its
creation time, its cost): the response's `model`, its choices (text or tool calls, finish reason,
logprobs as shown) and usage, with the tier that answered and the request's task. Only an answer
that ended on its own is stored: never an error (nothing reaches the store but a settled
answer), never a cut one (`finish_reason` `length` or `content_filter`), never a lower tier's
unverified answer given because the next tier was down.

A row read back is untrusted input: anyone who can write to the database, or a disk that flips a
bit, can put anything in it. So a row is served only when its size is within bounds, its digest
(SHA-256 over its key, its scope and its body) matches, it is for this key, scope and endpoint,
and its body has exactly the shape the endpoint serves and names a configured tier; the answer
served is rebuilt from the checked fields alone. Anything else is `InvalidEntry`: the request is
answered as a miss and the row is dropped.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.cache.keys import FORMAT, sha256
from router.cascade import CascadeResult
from router.ledger.entries import AttemptEntry, CacheRow, LedgerEntry

ENDED = ("stop", "tool_calls")  # finish reasons of an answer that ended on its own: the only ones stored
MAX_CHOICES = 128
_TEXT_BOUND = 256  # model, tier and request id: short names


class InvalidEntry(Exception):
    """A stored row that must not be served (why, in words)."""


@dataclass(frozen=True)
class CachedAnswer:
    """A checked entry: what a hit is answered with."""

    request_id: str  # the request whose answer it is
    tier: str
    model: str  # the response's `model`
    choices: list[dict[str, Any]]
    usage: dict[str, int]
    task: str | None
    task_why: str | None
    source: str = "exact-match cache hit"  # what served it again, for its ledger row's reason

    @property
    def finish_reason(self) -> str:
        return str(self.choices[-1]["finish_reason"])

    def entry(
        self, request_id: str, key_id: str, model: str, *, latency_s: float, user: str | None, team: str | None = None
    ) -> LedgerEntry:
        """The hit's ledger row: one `cached` attempt at the tier that answered, no tokens
        generated, nothing charged."""
        attempt = AttemptEntry(
            idx=0,
            tier=self.tier,
            decision="cached",
            reason=f"{self.source}: the answer of {self.request_id}",
            error=None,
            score=None,
            threshold=0.0,
            scores={},
            prompt_tokens=0,
            completion_tokens=0,
            finish_reason=self.finish_reason,
            latency_ms=None,
            busy_ms=None,
            verify_ms=0.0,
            cost_usd=0.0,
            verifier_cost_usd=0.0,
            verifier_tokens=0,
        )
        return LedgerEntry(
            request_id=request_id,
            ts=time.time(),
            key_id=key_id,
            model=model,
            tier=self.tier,
            escalated=False,
            unverified=False,
            latency_ms=latency_s * 1000,
            cost_usd=0.0,
            counterfactual_usd=0.0,
            attempts=(attempt,),
            task=self.task,
            task_why=self.task_why,
            user=user,
            team=team,
        )


def unstorable(payload: Mapping[str, Any], result: CascadeResult) -> str | None:
    """Why this answer must not be stored (None: it may be)."""
    if result.unverified:
        return "unverified"
    if any(c.get("finish_reason") not in ENDED for c in payload["choices"]):
        return "truncated"
    return None


def encode(shape: str, payload: Mapping[str, Any], result: CascadeResult) -> str:
    """The entry's body, from the response the client received."""
    task = result.task
    return json.dumps(
        {
            "v": FORMAT,
            "shape": shape,
            "request_id": payload["id"],
            "tier": result.final.tier,
            "model": payload["model"],
            "choices": payload["choices"],
            "usage": payload["usage"],
            "task": task.task if task else None,
            "task_why": task.why if task else None,
        },
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def digest(cache_key: str, scope: str, body: str) -> str:
    return sha256(f"{cache_key}\n{scope}\n{body}")


def decode(
    row: CacheRow, *, cache_key: str, scope: str, shape: str, max_bytes: int, tiers: frozenset[str]
) -> CachedAnswer:
    """The stored answer, checked whole; InvalidEntry when any part of it is not what was stored.
    `tiers`: the configured tiers' names, the only ones an entry can name (they are in the policy
    version), so a forged row cannot make a hit's header, ledger row and metrics name another."""
    if not isinstance(row.body, str) or len(row.body) > max_bytes or len(row.body.encode("utf-8")) > max_bytes:
        raise InvalidEntry("body missing or over max_entry_bytes")
    if not hmac.compare_digest(str(row.digest), digest(cache_key, scope, row.body)):
        raise InvalidEntry("digest does not match its key, scope and body")
    if row.cache_key != cache_key or row.scope != scope or row.shape != shape:
        raise InvalidEntry("stored for another key, scope or endpoint")
    try:
        data = json.loads(row.body)
    except (ValueError, RecursionError) as exc:
        raise InvalidEntry(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != FORMAT or data.get("shape") != shape:
        raise InvalidEntry("body is not an entry of this format and endpoint")
    choices = data.get("choices")
    if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
        raise InvalidEntry("choices missing, empty or too many")
    # the Responses and Messages surfaces store the chat form of their answers (router.api.surfaces)
    check = _completion_choice if shape == "text_completion" else _chat_choice
    tier = _name(data.get("tier"), "tier")
    if tier not in tiers:
        raise InvalidEntry("tier is not a configured tier")
    task = data.get("task")
    return CachedAnswer(
        request_id=_name(data.get("request_id"), "request_id"),
        tier=tier,
        model=_name(data.get("model"), "model"),
        choices=[check(i, c) for i, c in enumerate(choices)],
        usage=_usage(data.get("usage")),
        task=None if task is None else _name(task, "task"),
        task_why=_optional_text(data.get("task_why"), "task_why"),
    )


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= _TEXT_BOUND or not value.isprintable():
        raise InvalidEntry(f"{what} is not a short printable name")
    return value


def _optional_text(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidEntry(f"{what} is not text")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidEntry(f"{what} is not a count")
    return value


def _usage(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise InvalidEntry("usage is not an object")
    prompt = _int(value.get("prompt_tokens"), "usage.prompt_tokens")
    completion = _int(value.get("completion_tokens"), "usage.completion_tokens")
    if _int(value.get("total_tokens"), "usage.total_tokens") != prompt + completion:
        raise InvalidEntry("usage.total_tokens is not the sum of its parts")
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _common(i: int, choice: Any) -> tuple[str, dict[str, Any] | None]:
    if not isinstance(choice, dict) or choice.get("index") != i:
        raise InvalidEntry(f"choice {i} is not an object with its index")
    reason = choice.get("finish_reason")
    if reason not in ENDED:
        raise InvalidEntry(f"choice {i} did not end on its own ({reason!r})")
    logprobs = choice.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, dict):
        raise InvalidEntry(f"choice {i}: logprobs is not an object")
    return str(reason), logprobs


def _chat_choice(i: int, choice: Any) -> dict[str, Any]:
    reason, logprobs = _common(i, choice)
    message = choice.get("message")
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise InvalidEntry(f"choice {i}: message is not the assistant's")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidEntry(f"choice {i}: content is not text")
    checked: dict[str, Any] = {"role": "assistant", "content": content}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not calls:
            raise InvalidEntry(f"choice {i}: tool_calls is not a list of calls")
        checked["tool_calls"] = [_call(i, c) for c in calls]
    elif content is None:
        raise InvalidEntry(f"choice {i}: neither content nor tool calls")
    return {"index": i, "message": checked, "finish_reason": reason, "logprobs": logprobs}


def _call(i: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if (
        not isinstance(function, dict)
        or call.get("type") != "function"
        or not isinstance(call.get("id"), str)
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("arguments"), str)
    ):
        raise InvalidEntry(f"choice {i}: a tool call is not a function call")
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": function["arguments"]},
    }


def _completion_choice(i: int, choice: Any) -> dict[str, Any]:
    reason, logprobs = _common(i, choice)
    text = choice.get("text")
    if not isinstance(text, str):
        raise InvalidEntry(f"choice {i}: text is not text")
    return {"index": i, "text": text, "finish_reason": reason, "logprobs": logprobs}
