"""Reading an OpenAI-compatible server's logprobs of a given continuation (`cross_tier` scoring).

Two ways a server can score text it did not write, by `tiers[].openai.prompt_logprobs`:

- ``echo``: the legacy completions API with ``echo=true, logprobs=1``: the server returns the
  prompt's tokens with their pieces of text and logprobs (llama-cpp-python's server, OpenAI's older
  models, vLLM's completions). The request is sent as one text, so a chat request is rendered here
  with the model's chat template (`render_chat`: ChatML, as Qwen and SmolLM use), and the
  continuation's tokens are the trailing ones whose pieces make up its text. A caveat measured on
  llama-cpp-python's server (0.3.x): it pairs echoed tokens with logprobs one position late unless
  the prompt starts with the model's BOS token (it drops a leading BOS from the tokens, not from
  the logits rows). ChatML starts with SmolLM2's BOS; Qwen's BOS is another token, so for Qwen
  behind that server prefer a vLLM or llama.cpp-native tier.
- ``vllm``: vLLM's ``prompt_logprobs`` extension. A chat request is sent with the candidate as a
  final assistant message that the template leaves open (``add_generation_prompt=false,
  continue_final_message=true``), so the server renders exactly what it would have generated after;
  vLLM answers with, per prompt position, a map from token id to ``{logprob, rank, decoded_token}``
  holding the prompt's own token and the top choice. The continuation is the trailing positions
  whose decoded pieces make up its text.

Upstreams are not trusted: every list is bounded by what the request could truthfully produce, a
value of the wrong type makes the answer malformed (retried like any malformed answer), a logprob
must be a finite number at most 0 (a rounding excess up to 1e-6 is taken as 0; -inf, a token the
server found impossible, is clamped to `LOGPROB_FLOOR`), and a continuation that cannot be found in
the answer is malformed, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.backends.openai.upstream_io import Malformed
from router.generation import Message

LOGPROB_FLOOR = -1000.0
# A server may echo at most this many tokens per character sent (plus a few for the template and
# the one token generated): a tokenizer makes at most one token per byte, and a character is at
# most four bytes.
_TOKENS_PER_CHAR = 4
_TOKEN_SLACK = 64
_TOP_SLACK = 1e-6  # logprobs printed and parsed back may differ in the last digits


@dataclass(frozen=True)
class ScoredTokens:
    logprobs: tuple[float, ...]
    top1: tuple[bool, ...]
    echoed_tokens: int  # every token the server read, the prompt's included


def render_chat(template: str, messages: Sequence[Message]) -> str:
    """The prompt a ChatML model sees for `messages`, ready for the assistant's answer."""
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {template!r}")
    system = CHAT_TEMPLATES[template]
    parts: list[str] = []
    if system is not None and (not messages or messages[0].role != "system"):
        parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    parts.extend(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


# template name -> the system prompt the model's own template adds when the request has none
CHAT_TEMPLATES: dict[str, str | None] = {
    "chatml": None,
    "qwen2.5": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
}


def logprob(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(f"{what} is {type(value).__name__}, not a number")
    number = float(value)
    if math.isnan(number) or number > 1e-6:
        raise Malformed(f"{what} is {number!r}, not a logprob")
    return max(LOGPROB_FLOOR, min(number, 0.0))


def _list(obj: dict[str, Any], name: str, limit: int) -> list[Any]:
    value = obj.get(name)
    if not isinstance(value, list):
        raise Malformed(f"logprobs.{name} is {type(value).__name__}, not a list")
    if len(value) > limit:
        raise Malformed(f"logprobs.{name} has {len(value)} entries, more than the {limit} the prompt allows")
    return value


def read_echo(choice: dict[str, Any], sent: str, continuation: str) -> ScoredTokens:
    """The continuation's tokens from an echoed completion of `sent` (the prompt, continuation
    included): the text is `sent` and then whatever the server generated, so the continuation is
    the tokens, counted back from the end, whose pieces cover the generated text and then the
    continuation. Pieces, not `text_offset`: servers count offsets in text with the special tokens
    left out (llama-cpp-python), which the rendered prompt has."""
    lp = choice.get("logprobs")
    text = choice.get("text")
    if not isinstance(lp, dict) or not isinstance(text, str):
        raise Malformed("the echoed completion has no text or no logprobs")
    if not text.startswith(sent):
        raise Malformed("the completion does not echo the prompt")
    limit = _TOKENS_PER_CHAR * len(sent) + _TOKEN_SLACK
    tokens = _list(lp, "tokens", limit)
    values = _list(lp, "token_logprobs", limit)
    tops = _list(lp, "top_logprobs", limit)
    if not len(tokens) == len(values) == len(tops):
        raise Malformed("logprobs lists of different lengths")
    generated = len(text) - len(sent)
    want = generated + len(continuation)
    out: list[float] = []
    top1: list[bool] = []
    covered = 0
    for i in range(len(tokens) - 1, -1, -1):
        if covered >= want:
            break
        piece = tokens[i]
        if not isinstance(piece, str):
            raise Malformed(f"tokens[{i}] is {type(piece).__name__}, not text")
        covered += len(piece)
        if covered <= generated:  # a token the server generated after the continuation
            continue
        value = logprob(values[i], f"token_logprobs[{i}]")
        alternatives = tops[i]
        if not isinstance(alternatives, dict) or not alternatives or len(alternatives) > 64:
            raise Malformed(f"top_logprobs[{i}] is not a small object of alternatives")
        best = max(logprob(v, f"top_logprobs[{i}]") for v in alternatives.values())
        out.append(value)
        top1.append(value >= best - _TOP_SLACK)
    if covered < want or not out:
        raise Malformed("the echoed tokens do not reach back over the continuation")
    out.reverse()
    top1.reverse()
    return ScoredTokens(tuple(out), tuple(top1), len(tokens))


def read_vllm(prompt_logprobs: Any, prompt_chars: int, continuation: str) -> ScoredTokens:
    """The continuation's tokens from vLLM's `prompt_logprobs`: the trailing positions whose
    decoded pieces cover the continuation's text. Each position's map holds the prompt's own token
    and the top choice; the prompt's own is the one of highest rank (1 when it is the top)."""
    limit = _TOKENS_PER_CHAR * (prompt_chars + len(continuation)) + _TOKEN_SLACK
    if not isinstance(prompt_logprobs, list):
        raise Malformed(f"prompt_logprobs is {type(prompt_logprobs).__name__}, not a list")
    if len(prompt_logprobs) > limit:
        raise Malformed(f"prompt_logprobs has {len(prompt_logprobs)} entries, more than the prompt allows")
    out: list[float] = []
    top1: list[bool] = []
    covered = 0
    want = len(continuation.rstrip())  # a template may trim trailing whitespace of the final message
    for i in range(len(prompt_logprobs) - 1, -1, -1):
        if covered >= want:
            break
        entry = prompt_logprobs[i]
        if not isinstance(entry, dict) or not entry or len(entry) > 64:
            raise Malformed(f"prompt_logprobs[{i}] is not a small object of tokens")
        own: tuple[int, float, str] | None = None
        for item in entry.values():
            if not isinstance(item, dict):
                raise Malformed(f"prompt_logprobs[{i}] holds a {type(item).__name__}, not an object")
            rank, piece = item.get("rank"), item.get("decoded_token")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1 or not isinstance(piece, str):
                raise Malformed(f"prompt_logprobs[{i}]: rank must be a whole number >= 1, decoded_token text")
            value = logprob(item.get("logprob"), f"prompt_logprobs[{i}].logprob")
            if own is None or rank > own[0]:
                own = (rank, value, piece)
        assert own is not None
        out.append(own[1])
        top1.append(own[0] == 1)
        covered += len(own[2])
    if covered < want or not out:
        raise Malformed("prompt_logprobs do not reach back over the continuation")
    out.reverse()
    top1.reverse()
    return ScoredTokens(tuple(out), tuple(top1), len(prompt_logprobs))
