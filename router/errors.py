"""The exception hierarchy. Each type maps to one HTTP status in `router.api.errors`.

TierrouteError
 ├── ConfigError                 bad or inconsistent configuration (start-up)
 ├── ModelError                  catalog / model file problems
 │    └── IntegrityError         a file's size or sha256 does not match the pin
 ├── RequestError (400)          the request cannot be served as asked
 │    ├── ContextLengthError     prompt + max_tokens exceed the context
 │    ├── AnswerTooLargeError    its answer cannot fit under a tier's max_response_bytes
 │    ├── ResidencyError         a request that must stay on this machine, about to reach a remote tier
 │    ├── ChoicesUnsupportedError  n > 1 asked of an upstream that answers one choice
 │    ├── UnknownModelError (404)
 │    └── NotFoundError (404)    a thing the request names is not there (for this caller)
 ├── AuthError (401)
 ├── RateLimitError (429)        a key's, team's or user's request or token rate; carries retry_after
 ├── QuotaError (429)            a key's, team's or user's budget spent (OpenAI's insufficient_quota)
 ├── UpstreamRefusedError (502)  an upstream failed this request alone (it answers the tier's own)
 └── UnavailableError (503)      a tier cannot answer now; carries retry_after
      ├── OverloadedError        a local tier's queue is full
      ├── CircuitOpenError       the tier's breaker is open
      ├── UpstreamError          retries spent against an upstream server
      └── DeadlineError          the request's deadline passed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.generation import Generation


class TierrouteError(Exception):
    """Base of every error tierroute raises on purpose."""


class ConfigError(TierrouteError):
    pass


class ModelError(TierrouteError):
    pass


class IntegrityError(ModelError):
    pass


class RequestError(TierrouteError):
    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ContextLengthError(RequestError):
    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages", code="context_length_exceeded")


class AnswerTooLargeError(RequestError):
    """The answer a request asks for cannot fit under a tier's `max_response_bytes`: said at
    admission, before any work, or once an upstream's answer was cut there
    (`router.backends.openai.answer_size`). `spent`: what that answer cost (the cascade records it,
    and the key is charged), None when nothing was generated."""

    def __init__(self, message: str, *, param: str, spent: Generation | None = None) -> None:
        super().__init__(message, param=param, code="response_too_large")
        self.spent = spent


class ResidencyError(RequestError):
    """A request a guard keeps on this machine (`GenerationRequest.local_only`) was about to be sent
    to a tier that is not local. Raised where a remote backend builds what it sends, so no path (a
    cascade, a verifier asking another tier, shadow escalation) can send it by mistake."""

    def __init__(self, tier: str) -> None:
        super().__init__(
            f"This request may be answered only on this machine, and tier '{tier}' is not local.",
            code="must_stay_local",
        )
        self.tier = tier


class ChoicesUnsupportedError(RequestError):
    """A request for n > 1 choices that the tier's upstream answered with fewer (llama-cpp-python's
    server ignores `n`): the upstream is alive and did what it does, so no breaker hears of it
    and no other attempt is made; the client is told to ask for one choice at a time. `spent`: the
    answer it did send (the cascade records it, and the key is charged)."""

    def __init__(self, message: str, *, spent: Generation | None = None) -> None:
        super().__init__(message, param="n", code="n_not_supported")
        self.spent = spent


class UpstreamRefusedError(TierrouteError):
    """An upstream answered this request with a 5xx (or an error event) while it answers a request
    of the tier's own: the failure is the request's, not the deployment's
    (`router.backends.openai.outages`). Not retried, not counted against a breaker; 502, because the
    upstream failed it and a 400 would claim more than is known. `spent`: what it cost (the cascade
    records it, and the key is charged), None when the text it streamed says so."""

    def __init__(self, message: str, *, spent: Generation | None = None) -> None:
        super().__init__(message)
        self.spent = spent


class UnknownModelError(RequestError):
    """404. `restricted`: the caller is held to some models, and `available` is what it may use:
    the message then does not say whether the model exists (OpenAI's words for that case)."""

    def __init__(self, model: str, available: list[str], *, restricted: bool = False) -> None:
        said = "does not exist or this key may not use it" if restricted else "does not exist"
        super().__init__(
            f"The model '{model}' {said}. Available: {', '.join(available) or 'none'}",
            param="model",
            code="model_not_found",
        )


class NotFoundError(RequestError):
    pass


class AuthError(TierrouteError):
    """401. `reason`: 'no_key', 'unknown_key', 'revoked' or 'expired'; `key_id`: the stored key's
    name when the key presented is one (revoked or expired), for the audit of refused admin
    attempts (`router.control.refusals`); never shown to the caller."""

    def __init__(self, message: str, *, reason: str = "no_key", key_id: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.key_id = key_id


class RateLimitError(TierrouteError):
    """`kind`: what ran out, "requests" (per minute) or "tokens" (per minute), as OpenAI's error
    type says it; `limit`: which one, "key.requests_per_minute", "team.tokens_per_minute", ...;
    `retry_after`: None when waiting cannot help (the request alone is over the limit)."""

    def __init__(
        self, message: str, retry_after: float | None, *, kind: str = "requests", limit: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.kind = kind
        self.limit = limit


class QuotaError(TierrouteError):
    """A budget is spent. `retry_after`: seconds until it resets (None: unknown, or waiting cannot
    help because the request alone costs more than the budget); `limit`: which one,
    "key.usd_per_day", "team.usd_per_month", "user.usd_per_day", ..."""

    def __init__(self, message: str, *, retry_after: float | None = None, limit: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit


class UnavailableError(TierrouteError):
    """`spent`: what the failed request cost all the same, when a tier knows (a request cut at its
    deadline while the upstream generated for it); None: nothing, or what it streamed says."""

    def __init__(self, message: str, retry_after: float = 30.0, *, spent: Generation | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.spent = spent


class OverloadedError(UnavailableError):
    pass


class CircuitOpenError(UnavailableError):
    pass


class UpstreamError(UnavailableError):
    pass


class DeadlineError(UnavailableError):
    pass


def spent_of(exc: BaseException) -> Generation | None:
    """What a failed request cost, as the error that ended it says (`spent` of the errors above)."""
    return getattr(exc, "spent", None) if isinstance(exc, TierrouteError) else None
