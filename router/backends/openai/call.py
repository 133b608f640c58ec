"""One logical request to an OpenAI-compatible upstream: its deadline, its bounds, the body sent.

The backend makes one `Call` per request and hands it to every attempt, so the attempts share one
deadline (`request.deadline` or now + the tier's `timeout_s`, whichever is sooner) and one
`max_tokens` (the request's, cut to the tier's). The readers (`reading`, `streams`) hold what the
upstream says against the bounds derived here:

- Usage. The prompt's token count is at most the UTF-8 bytes of everything it was sent (a
  tokenizer gives at most one token per byte; `router.wire`: messages, calls,
  tools, schema) plus an allowance per message for the chat template and one for a system prompt a
  hosted API may add; the completion's at most the `max_tokens` we sent, for each of `n` choices,
  plus a small slack for a stop sequence or end-of-text token a server counts. Admission reserves
  exactly these limits (`OpenAIBackend.prompt_token_limit`, `completion_token_limit`).
- Streams. A stream may bring at most twice the completion bound in pieces of text: a server sends
  a token or more per piece, so an upstream that ignores `max_tokens` is stopped there, long before
  the byte limit.

The body passes the client's sampling parameters, stops, tools, `logit_bias`, penalties and
`response_format` through as they came: the upstream enforces them, or refuses and the client hears
it, rather than this tier answering without them. The optional parameters a server may refuse
(`logprobs`, `stream_options`) are left out once the deployment is known to refuse them, and for
one request once it was refused in words naming them (`Call.omitted`, `refusals`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from router.generation import GenerationRequest, NamedTool
from router.wire import completion_token_bound, message_json, prompt_token_bound

# Tokens a server may count past max_tokens: a stop sequence or end-of-text token it includes.
_COMPLETION_SLACK = 8
# A tokenizer gives at most one token per byte of text; a chat template adds a few per message (a
# hosted API's own system prompt is the tier's `hosted_prompt_tokens`).
_TEMPLATE_TOKENS_PER_MESSAGE = 64
# What a chat template adds per message, as an estimate (not a bound): `estimate_prompt_tokens`.
TEMPLATE_TOKENS_ESTIMATE = 5


@dataclass
class Call:
    """One logical request: its deadline, its bounds, and what it has cost so far."""

    request: GenerationRequest
    deadline: float
    started: float
    max_tokens: int  # what the upstream is asked for
    hosted_prompt_tokens: int  # what the server may add to the prompt (the tier's setting)
    attempts: int = 0
    streamed: bool = False  # its attempts stream (`stream`), rather than answer whole (`generate`)
    # the current attempt's own end, sooner than the deadline when other deployments remain to be
    # tried (router.backends.openai.failover); None between attempts and once a stream has begun
    attempt_until: float | None = None
    headers: dict[str, str] | None = None  # sent with every attempt: the W3C traceparent when tracing
    # optional parameters this request alone goes without: refused in words naming them (which a
    # client can steer, `refusals`), or the tier's own logprobs trimmed for its size (`answer_size`)
    omitted: set[str] = field(default_factory=set)
    answer_bytes: int = 0  # the most an honest answer to the last attempt, as sent, takes (`answer_size`)
    usage_raised: int = 0  # answers whose reported usage was below its floor and raised to it (`reading`)
    # deployments whose outage verdict this request has counted once against the breaker: its own
    # later tries there, failing the same way, count no more (`outages`)
    outage_counted: set[str] = field(default_factory=set)

    def unsent(self, refused: Set[str]) -> set[str]:
        """The optional parameters not sent on this attempt: those the deployment refuses
        (`refused`) and those this request goes without."""
        return {*refused, *self.omitted}

    def remaining(self) -> float:
        """Seconds left to the current attempt (the deadline, or sooner: see `attempt_until`)."""
        until = self.deadline if self.attempt_until is None else min(self.deadline, self.attempt_until)
        return until - time.monotonic()

    @functools.cached_property
    def prompt_limit(self) -> int:
        """The most prompt tokens a server could truthfully report for this request."""
        return prompt_limit(self.request, self.hosted_prompt_tokens)

    @property
    def completion_limit(self) -> int:
        """The most completion tokens, all `n` choices (the bound admission reserves)."""
        return completion_limit(self.request, self.max_tokens)

    @property
    def piece_limit(self) -> int:
        """The most pieces of text a stream may bring: a server sends a token or more per piece;
        twice that leaves room for one that splits tokens, and still stops one that ignores
        max_tokens long before the byte limit."""
        return 2 * self.completion_limit


def prompt_limit(request: GenerationRequest, hosted_prompt_tokens: int) -> int:
    """A token per byte of everything sent (tools, schemas, calls), and room for a hosted API's own
    system prompt (`[tiers.openai] hosted_prompt_tokens`); admission reserves this same bound."""
    return prompt_token_bound(request, per_message=_TEMPLATE_TOKENS_PER_MESSAGE, fixed=hosted_prompt_tokens)


def completion_limit(request: GenerationRequest, max_tokens: int | None) -> int:
    """`n` choices of `max_tokens` (the request's, cut to the tier's) and the slack."""
    return completion_token_bound(request, max_tokens) + _COMPLETION_SLACK


def prompt_text(request: GenerationRequest) -> str:
    if request.prompt is not None:
        return request.prompt
    # what the prompt holds: the messages, their calls, and the tools the template renders
    parts = [m.content for m in request.messages or ()]
    parts += [c.arguments for m in request.messages or () for c in m.tool_calls]
    parts += [f"{t.name} {t.description or ''} {t.parameters_json or ''}" for t in request.tools]
    return "\n".join(parts)


def estimate_tokens(text: str) -> int:
    """Text's tokens when the server reports none (an estimate, not a bound): four characters a
    token for ASCII letters and white space (English averages about that), a token a digit
    (SmolLM2's, Qwen's and Llama 2's tokenizers split numbers into digits), two other ASCII
    characters (punctuation) a token, and two UTF-8 bytes a token for everything else. At four
    characters a token for all text, the fourth review's streamed prompt of 112 Chinese characters
    was charged 38 tokens where llama-cpp-python's server counted 254 (SmolLM2), 400 digits 110
    where it counted 430; the other scripts measured there (Cyrillic, Arabic, emoji) take 0.4 to
    0.75 tokens a byte. Counted by bytes.translate, in C: a prompt of megabytes costs milliseconds."""
    if not text:
        return 0
    sent = text.encode("utf-8", "replace")
    narrow = sent.translate(None, _NON_ASCII)
    rest = narrow.translate(None, _WORD_CHARS)
    marks = rest.translate(None, _DIGITS)
    letters, digits, wide = len(narrow) - len(rest), len(rest) - len(marks), len(sent) - len(narrow)
    return max(1, round(letters / 4 + digits + len(marks) / 2 + wide / 2))


_NON_ASCII = bytes(range(128, 256))
_WORD_CHARS = bytes(c for c in range(128) if chr(c).isalpha() or chr(c).isspace())
_DIGITS = b"0123456789"


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """The prompt's tokens when the server reports none: its text at about four characters a token,
    and for a chat the template's own, which the text does not show: `TEMPLATE_TOKENS_ESTIMATE`
    a message (ChatML's `<|im_start|>`, the role, a newline, `<|im_end|>`, a newline; Llama 3's
    and OpenAI's own are as many or fewer) and as many again to open the reply. Each message's
    text counts at least a token. Without the template's share 200 one-character messages were
    charged 100 tokens where llama-cpp-python's server counted 1,324 (issue 38's review)."""
    if request.messages is None:
        return estimate_tokens(prompt_text(request))
    tools = [f"{t.name} {t.description or ''} {t.parameters_json or ''}" for t in request.tools]
    per_message = (
        TEMPLATE_TOKENS_ESTIMATE + max(1, estimate_tokens(m.content + "".join(c.arguments for c in m.tool_calls)))
        for m in request.messages
    )
    return sum(per_message) + TEMPLATE_TOKENS_ESTIMATE + estimate_tokens("\n".join(tools))


# -- the body sent -------------------------------------------------------------------------------


def request_params(call: Call, *, model: str, refused: Set[str], stream: bool) -> dict[str, Any]:
    """The SDK's arguments for one attempt at `call`, leaving out the optional parameters in
    `refused` (those the server has refused before)."""
    request = call.request
    params: dict[str, Any] = {
        "model": model,
        "max_tokens": call.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.seed is not None:
        params["seed"] = request.seed
    if request.n > 1 and not stream:  # the cascade asks for n > 1 only through generate
        params["n"] = request.n
    if request.stop:
        params["stop"] = list(request.stop)
    if request.messages is not None:
        params["messages"] = [message_json(m) for m in request.messages]
        params.update(_tool_params(request))
    else:
        params["prompt"] = request.prompt
    # passed through as the client sent them: the upstream enforces them (or refuses, which the
    # client then hears) rather than this tier answering without them
    if request.logit_bias:
        params["logit_bias"] = {str(token): bias for token, bias in request.logit_bias}
    if request.presence_penalty:
        params["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty:
        params["frequency_penalty"] = request.frequency_penalty
    if request.response_format is not None:
        if request.is_chat:
            params["response_format"] = request.response_format.to_openai()
        else:  # not the SDK's completions parameter, but vLLM's and llama.cpp's servers take it
            params["extra_body"] = {"response_format": request.response_format.to_openai()}
    if "logprobs" not in refused:
        if request.is_chat:
            # top_logprobs=0 is OpenAI's "none of the alternatives"; llama-cpp-python's server
            # returns no logprobs at all without it.
            params["logprobs"] = True
            params["top_logprobs"] = request.top_logprobs
        else:
            params["logprobs"] = max(1, request.top_logprobs)
    if stream:
        params["stream"] = True
        if "stream_options" not in refused:
            params["stream_options"] = {"include_usage": True}
    return params


def _tool_params(request: GenerationRequest) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as the client gave them (passed through)."""
    if not request.tools:
        return {}
    params: dict[str, Any] = {"tools": [t.to_openai() for t in request.tools]}
    choice = request.tool_choice
    if isinstance(choice, NamedTool):
        params["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        params["tool_choice"] = choice
    if not request.parallel_tool_calls:
        params["parallel_tool_calls"] = False
    return params
