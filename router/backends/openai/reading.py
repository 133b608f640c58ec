"""Reading an upstream's answer: choices, usage, logprobs, top-k and tool calls, checked and clamped.

An upstream is not trusted any more than a client is (docs/design.md, security boundary). Its bytes
are bounded first by `router.backends.openai.upstream_io`; what they say is read here, for a plain answer
(`read_response`) and, piece by piece, for a stream (`router.backends.openai.streams`).

- Shape. The SDK builds the request and maps error statuses; answers are parsed here from the raw
  JSON, not through the SDK's models, which it builds without validation and which let any type
  through. A field of the wrong type makes the answer malformed (retried like a 5xx); bytes that
  are not UTF-8 and lone surrogates become U+FFFD; only choice 0 is read, however many are sent
  (choices 1 to n-1 too when the request asked for n). An answer with fewer choices than the n
  asked for is a server that does not honour n (llama-cpp-python's ignores it): `FewerChoices`,
  carrying what it did send, which the backend charges and refuses as the request's, never as a
  failure of the server (it answered).
  Logprobs must be finite and at most 0, or the tier's logprobs for that answer are dropped.
  Top-k alternatives (asked for only when the request wants them) are clamped: at most the k
  asked for, the likeliest kept; an alternative whose logprob is not a finite number at most 0 is
  dropped; a piece is cut to `MAX_PIECE_CHARS`; more tokens than the answer could have, or a
  malformed shape, drops the answer's top-k (its text stands).
- Tool calls. Names and ids reach the client and the ledger: each is cut to a sane length, at most
  `MAX_CALLS` calls are kept, and an id that is missing, too long or not printable is replaced by
  one of ours (the client echoes it back).
- Usage. Token counts must be whole numbers, at least 0, and within the bounds `Call` derives (the
  prompt's at most its UTF-8 bytes plus a template allowance, the completion's at most the
  `max_tokens` we sent plus a small slack). Anything else and the whole usage is refused with a
  warning in the log, and the counts are estimated as for a server that reports none (never above
  `max_tokens`). A count may not be too low either: an upstream that reports 0/0 for a 200-token
  answer would make it free and invisible to token-rate limits. Each count is at least what was
  sent and delivered must have taken (`prompt_floor`, `completion_floor`): a token per
  `MAX_PIECE_CHARS` characters of text, and one per logprob entry the answer carries; a count below
  its floor is replaced by the floor, with a warning in the log, and counted
  (`tierroute_backend_usage_raised_total`). The same floors hold for counts the tier estimates, and
  for a stream at every piece, so a stream cut short is priced no lower (`streams`).
  Why characters over `MAX_PIECE_CHARS`: the floor must be a bound, or an honest server's count
  is raised above the truth. No token the tier takes is longer than `MAX_PIECE_CHARS` (the reader
  cuts a longer piece as an upstream filling memory, and `answer_size` bounds answers by it), so
  no tokenizer can count fewer; any tighter figure (English's four characters a token, or the 32
  bytes used before, which a vocabulary's runs of `=` or spaces exceed) is an estimate, and it
  would charge an honest count of long tokens more than the upstream did. The cost: an upstream
  that lies about usage can cut an English answer's count to about a sixteenth where no logprob
  entries count it exactly (the tier asks for them by default, one a token).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from router.backends.openai.call import Call, estimate_prompt_tokens, estimate_tokens, prompt_text
from router.backends.openai.upstream_io import (
    FewerChoices,
    Malformed,
    clean_text,
    first_choice,
    model_name,
    token_count,
    token_logprobs,
    typed_field,
)
from router.generation import FinishReason, Generation, TokenLogprob, ToolCall
from router.structured.tools import MAX_CALLS, new_call_id

log = logging.getLogger(__name__)

# The longest token the tier takes, in characters: a token's text is a few characters (a
# vocabulary's longest, runs of spaces, dashes or `=`, tens); a longer "piece" is an upstream filling
# memory, cut here. The one figure for a token's length: the usage floors count a token per this
# many characters, and `answer_size` bounds an honest answer with it.
MAX_PIECE_CHARS = 64
# An upstream's call names and ids reach the client and the ledger: cut to a sane length.
_MAX_CALL_NAME_CHARS = 256
_MAX_CALL_ID_CHARS = 256


def read_response(
    body: dict[str, Any], call: Call, *, tier: str, model: str, logprobs: bool, index: int = 0
) -> Generation:
    """The answer in a non-streamed response body: choice `index`, and for choice 0 of a request
    for n > 1 the others too (`Generation.others`). `logprobs`: whether the tier reads them (off by
    config, or refused upstream); `model`: the name to report when the body names none."""
    choice = first_choice(body.get("choices"), required=True, index=index)
    assert choice is not None
    if call.request.is_chat:
        message = typed_field(choice, "message", dict)
        text = typed_field(message or {}, "content", str) or ""
        calls = _tool_calls(message or {}) if call.request.offers_tools else None
    else:
        calls = None
        text = typed_field(choice, "text", str) or ""
    finish = typed_field(choice, "finish_reason", str)
    token_lps = None
    tops = None
    if logprobs:
        token_lps = token_logprobs(choice.get("logprobs"))
        if call.request.top_logprobs:
            tops = top_logprobs(choice.get("logprobs"), call.request.top_logprobs, call.completion_limit)
    # usage covers every choice: choice 0 carries it (merged below), the others count their own
    prompt_tokens, completion_tokens = (0, None) if index else checked_usage(body.get("usage"), call, tier)
    if prompt_tokens is None:
        prompt_tokens = max(estimate_prompt_tokens(call.request), prompt_floor(call))
    elif not index:
        prompt_tokens = raised(prompt_tokens, prompt_floor(call), "prompt_tokens", call, tier)
    reported = completion_tokens  # the server's count covers every choice; None: each is estimated
    if completion_tokens is None:
        counted = len(token_lps) if token_lps is not None else estimate_tokens(text)
        completion_tokens = min(counted, call.max_tokens)
    generation = Generation(
        text=clean_text(text),
        finish_reason=finish_reason(finish),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        token_logprobs=token_lps,
        latency_s=time.monotonic() - call.started,
        model=model_name(body.get("model")) or model,
        top_logprobs=tops,
        tool_calls=calls,
        constrained=None if call.request.response_format is not None else False,
    )
    if index > 0:
        return generation
    sent = _indices(body.get("choices"))
    others = tuple(
        read_response(body, call, tier=tier, model=model, logprobs=logprobs, index=i)
        for i in range(1, call.request.n)
        if i in sent
    )
    floor = completion_floor((generation, *others), call)
    if reported is None:  # no usage from the server: choice 0's estimate alone would under-bill
        estimated = max(generation.completion_tokens + sum(g.completion_tokens for g in others), floor)
        completion_tokens = min(estimated, call.request.n * call.max_tokens)  # an estimate: never past asked
    else:  # the server's count, but never below what the choices it sent must have taken
        completion_tokens = raised(reported, floor, "completion_tokens", call, tier)
    answer = replace(generation, completion_tokens=completion_tokens, others=others)
    if len(others) < call.request.n - 1:
        # the server answered, with fewer choices than asked: it does not honour n, which is no
        # failure of its own (module docstring); what it sent is what the request cost
        raise FewerChoices(f"{1 + len(others)} of the {call.request.n} choices asked for", answer)
    return answer


def _indices(choices: Any) -> set[int]:
    """The indices of the choices a body carries (their shapes were checked by `first_choice`)."""
    found = (c.get("index", 0) for c in choices if isinstance(c, dict)) if isinstance(choices, list) else ()
    return {i for i in found if isinstance(i, int) and not isinstance(i, bool)}


def finish_reason(reason: str | None) -> FinishReason:
    return "length" if reason == "length" else "stop"


# -- usage ---------------------------------------------------------------------------------------


def checked_usage(usage: Any, call: Call, tier: str) -> tuple[int | None, int | None]:
    """The server's (prompt, completion) token counts, each None where it sent none; both None,
    with a warning, when either is impossible for this request (module docstring)."""
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        log.warning("tier %s: upstream usage refused (not an object: %.200r); estimating", tier, usage)
        return None, None
    counts = []
    for name, limit in (("prompt_tokens", call.prompt_limit), ("completion_tokens", call.completion_limit)):
        value = usage.get(name)
        count = token_count(value)
        if value is not None and (count is None or count > limit):
            log.warning(
                "tier %s: upstream usage refused (%s=%.100r, at most %d possible); estimating",
                tier,
                name,
                value,
                limit,
            )
            return None, None
        counts.append(count)
    return counts[0], counts[1]


def text_tokens(text: str) -> int:
    """The fewest tokens `text` can be (module docstring, usage)."""
    return chars_tokens(len(text))


def chars_tokens(chars: int) -> int:
    """The fewest tokens `chars` characters of text can be: none is longer than `MAX_PIECE_CHARS`."""
    return -(-chars // MAX_PIECE_CHARS)


def prompt_floor(call: Call) -> int:
    """The fewest prompt tokens what was sent can be counted for (the text of every message, call
    and tool: `call.prompt_text`)."""
    return text_tokens(prompt_text(call.request))


def completion_floor(choices: Iterable[Generation], call: Call) -> int:
    """The fewest completion tokens the choices delivered can have taken: per choice, its text and
    calls at `MAX_PIECE_CHARS` characters a token, or its logprob entries (one a token) where more;
    never above what the request could be counted for (`call.completion_limit`)."""
    total = 0
    for g in choices:
        calls = "".join(c.name + c.arguments for c in g.tool_calls or ())
        total += max(text_tokens(g.text + calls), len(g.token_logprobs or ()))
    return min(total, call.completion_limit)


def raised(count: int, floor: int, name: str, call: Call, tier: str) -> int:
    """`count` as the server reported it, or `floor` (with a warning, counted) when it is less."""
    if count >= floor:
        return count
    log.warning(
        "tier %s: upstream usage %s=%d is below what it delivered (at least %d); counted as %d",
        tier,
        name,
        count,
        floor,
        floor,
    )
    call.usage_raised += 1
    return floor


# -- top-k alternatives --------------------------------------------------------------------------


def top_logprobs(logprobs: Any, k: int, max_tokens: int) -> tuple[TokenLogprob, ...] | None:
    """Each token's piece, logprob and at most k alternatives, from a chat (`content`) or legacy
    completions (`tokens`, `token_logprobs`, `top_logprobs`) shape, clamped as the module
    docstring says; None when the shape is wrong or there are more than `max_tokens` tokens."""
    if not isinstance(logprobs, dict):
        return None
    rows: list[tuple[Any, Any, Any]] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                return None
            rows.append((item.get("token"), item.get("logprob"), item.get("top_logprobs")))
    else:
        tokens, values, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
        if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
            return None
        if not isinstance(tops, list) or len(tops) != len(tokens):
            return None
        rows = list(zip(tokens, values, tops, strict=True))
    if len(rows) > max_tokens:
        return None
    out: list[TokenLogprob] = []
    for token, value, alternatives in rows:
        logprob = _logprob(value)
        if not isinstance(token, str) or logprob is None:
            return None
        out.append(TokenLogprob(_piece(token), logprob, _alternatives(alternatives, k)))
    return tuple(out)


def _alternatives(raw: Any, k: int) -> tuple[tuple[str, float], ...]:
    """At most k (piece, logprob) pairs, likeliest first, from a chat list of objects or a
    completions object mapping piece to logprob; what is not a well-formed pair is left out."""
    pairs: list[tuple[str, float]] = []
    if isinstance(raw, dict):
        items: list[tuple[Any, Any]] = list(raw.items())[: 4 * k]  # bound the work on a huge object
    elif isinstance(raw, list):
        items = [(a.get("token"), a.get("logprob")) for a in raw[: 4 * k] if isinstance(a, dict)]
    else:
        return ()
    for token, value in items:
        logprob = _logprob(value)
        if isinstance(token, str) and logprob is not None:
            pairs.append((_piece(token), logprob))
    pairs.sort(key=lambda pair: -pair[1])
    return tuple(pairs[:k])


def _logprob(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number) or number > 1e-6:  # a probability above 1 is not one
        return None
    return min(number, 0.0)


def _piece(token: str) -> str:
    return clean_text(token[:MAX_PIECE_CHARS])


# -- tool calls ----------------------------------------------------------------------------------


def _tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...] | None:
    """A response message's `tool_calls`, read as any upstream field is (see the module
    docstring): a wrong type makes the answer malformed; names and ids are cut to a sane length
    and at most `MAX_CALLS` calls are kept. None when there are none."""
    raw = typed_field(message, "tool_calls", list)
    if not raw:
        return None
    calls = []
    for item in raw[:MAX_CALLS]:
        if not isinstance(item, dict):
            raise Malformed(f"a tool call is {type(item).__name__}, not an object")
        function = typed_field(item, "function", dict)
        if function is None:
            raise Malformed("a tool call has no function")
        name = typed_field(function, "name", str)
        if not name:
            raise Malformed("a tool call has no function name")
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else arguments_text(arguments)
        calls.append(tool_call(typed_field(item, "id", str), name, text))
    return tuple(calls)


def arguments_text(arguments: Any) -> str:
    # some servers send arguments as an object rather than its JSON text; anything else is wrong
    if arguments is None:
        return ""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    raise Malformed(f"a tool call's arguments are {type(arguments).__name__}, not a string")


def tool_call(call_id: str | None, name: str, arguments: str) -> ToolCall:
    if call_id is None or not 0 < len(call_id) <= _MAX_CALL_ID_CHARS or not call_id.isprintable():
        call_id = new_call_id()  # the client echoes it back: ours rather than a malformed one
    return ToolCall(
        call_id,
        clean_text(name[:_MAX_CALL_NAME_CHARS]),
        clean_text(arguments),
    )
