"""How large an honest answer to a request can be, and so whose fault an answer over the limit is.

An `openai` tier reads at most `max_response_bytes` of one answer (and at most `max_stream_events`
events of a stream): past that it stops reading, never buffering without bound. What an honest
upstream sends grows with what the request asks for, and all of that is the client's choice: `n`
choices of `max_tokens` tokens, each token with its logprob entry and `top_logprobs` alternatives.
A request for 8 choices of 512 tokens with 20 alternatives each is answered honestly with about
5 MB. Counting such a refusal as the upstream failing let one key open every deployment's breaker
for every tenant (issue 38). So the size of an answer is judged against the request:

- `estimate` is what an honest answer to a request, as sent, takes: per token, its text, its logprob
  entry (when logprobs are asked) and each alternative, and per streamed token its event's
  envelope; plus each choice's and the body's own. `typical` is generous for what servers send
  (llama-cpp-python's server measured a quarter to a third below it); `most` allows every token
  to be as long as the tier's reader takes one (`reading.MAX_PIECE_CHARS`), each of its bytes as
  JSON can spell it at its longest (`ESCAPED_BYTES_PER_BYTE`), in its text, in its logprob entry
  and in each alternative, with each entry's `bytes` list at its longest too. It is a bound, not an
  estimate: an answer past it is no honest one, whatever the tokenizer or the server (short of
  a vocabulary with long runs of control bytes, which JSON writes six bytes each).
- Admission refuses a request whose answer, as the client asked for it, is estimated over the
  limit (`refusal`, on its `typical` size; asked through `Backend.refuse_oversized` by
  `router.admission.accounting`): a 400 in OpenAI's shape naming the parameter to lower
  (`top_logprobs`, or `logprobs` on completions, then `n`, then `max_tokens`), before any work or
  charge.
- The tier's own additions (the logprobs it asks for its confidence verifier) are trimmed for a
  request whose typical answer they alone would push over (`OpenAIBackend`): that request goes
  without them.
- An answer over the limit is then the upstream's failure (a breaker failure; the request moves to
  another deployment) only when no honest answer to the request could be that large: its `most`
  fits. Otherwise the answer may be an honest one of long tokens, so it is the request's: the
  breaker hears nothing against the upstream, no other deployment is asked (it would generate it
  again, at the operator's cost), and the client gets a 400 (`AnswerTooLargeError`) and is charged
  for what the upstream generated (`OpenAIBackend._too_large`: `n * max_tokens` completion tokens,
  all it can have generated, since its usage, at the body's end, never arrived). An error body
  over the limit says nothing of the request: always the upstream's.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.backends.openai.reading import MAX_PIECE_CHARS
from router.errors import AnswerTooLargeError
from router.generation import GenerationRequest

# An honest answer's bytes per token, JSON-escaped as servers send it. Measured on llama-cpp-python's
# server (SmolLM2, 128 tokens of a story; docs/deployments.md): 146 a token with its logprob entry,
# 58 an alternative, 272-390 a stream event's envelope; these leave a third or more above that.
TEXT_BYTES_PER_TOKEN = 8
ENTRY_BYTES = 192
ALTERNATIVE_BYTES = 80
STREAM_EVENT_BYTES = 448
CHOICE_BYTES = 512  # a choice's own keys: index, message, role, finish_reason
BODY_BYTES = 2048  # the body's: id, model, usage, and a stream's role chunk, usage chunk and [DONE]
# The most one token can honestly take, derived from the longest token the reader takes
# (`reading.MAX_PIECE_CHARS`: no vocabulary's token is longer, in characters or in UTF-8 bytes; its
# longest are ASCII runs of `=`, spaces or tabs): each of its UTF-8 bytes as JSON spells it at its
# longest (a 2-byte character as `\uXXXX` under ensure_ascii is 3 a byte, a tab or a newline 2),
# and in an entry's `bytes` list each byte as `255, `.
ESCAPED_BYTES_PER_BYTE = 3
TOKEN_TEXT_MOST = MAX_PIECE_CHARS * ESCAPED_BYTES_PER_BYTE
TOKEN_BYTES_LIST_MOST = MAX_PIECE_CHARS * len("255, ")


@dataclass(frozen=True)
class Size:
    """An answer's size: `typical` as servers send it, `most` with every token as long as one can be."""

    typical: int
    most: int


def estimate(request: GenerationRequest, *, max_tokens: int, logprobs: bool, top_k: int, stream: bool) -> Size:
    """The bytes an honest answer to `request` takes when asked for `max_tokens` per choice, with
    logprobs (and `top_k` alternatives per token) or without, streamed or not."""
    tokens = request.n * max(0, max_tokens)
    fixed = BODY_BYTES + request.n * CHOICE_BYTES + (tokens * STREAM_EVENT_BYTES if stream else 0)
    typical = TEXT_BYTES_PER_TOKEN + (ENTRY_BYTES + top_k * ALTERNATIVE_BYTES if logprobs else 0)
    # the longest token spelt out: its text, and with logprobs again (with its bytes) in its entry
    # and in each alternative, each of which keeps its envelope
    spelt = TOKEN_TEXT_MOST + TOKEN_BYTES_LIST_MOST
    most = TOKEN_TEXT_MOST + ((ENTRY_BYTES + spelt) + top_k * (ALTERNATIVE_BYTES + spelt) if logprobs else 0)
    return Size(fixed + tokens * typical, fixed + tokens * most)


def refusal(
    request: GenerationRequest, *, max_tokens: int, limit: int, stream: bool, tier: str
) -> AnswerTooLargeError | None:
    """The 400 for a request whose answer, as the client asked for it (`request.top_logprobs`: the
    alternatives it wants shown, 0 without logprobs), is estimated over `limit`; None if it fits."""
    k = request.top_logprobs

    def fits(r: GenerationRequest, top_k: int) -> bool:
        return estimate(r, max_tokens=max_tokens, logprobs=top_k > 0, top_k=top_k, stream=stream).typical <= limit

    if fits(request, k):
        return None
    if k > 0 and fits(request, 0):
        param = "top_logprobs" if request.is_chat else "logprobs"
    elif request.n > 1 and fits(request.with_(n=1), k):
        param = "n"
    else:
        param = "max_tokens"
    return AnswerTooLargeError(
        f"tier {tier}: the answer asked for (n={request.n}, max_tokens={max_tokens}, top_logprobs={k}) "
        f"would be larger than this tier takes from its upstream (max_response_bytes = {limit}); lower {param}",
        param=param,
    )
