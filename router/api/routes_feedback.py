"""POST /v1/feedback: a client labels the answer to one of its own requests.

The application often knows whether an answer was right (the user clicked thumbs-down, the tests
passed, the extracted JSON was accepted); this is where it says so. A label names the request by
the `request_id` of its `tierroute` object, and carries a score in [0, 1] or a boolean, an
optional label name and an optional comment. It is written to the ledger's `feedback` table,
tied to the request's row, with who gave it: the key's name, whether it was an admin reviewer's
(`role`) and the key's team. A request may be labelled many times, and every label is kept with
the time it arrived. What labels mean (right at 0.5 and above; a reviewer's latest decides over
any client's, else the latest) is `router.quality.feedback`'s; the report, the drift detector and
`eval import --ledger` read them, the import only the givers it is told to trust.

Only the key that made a request may label it, or a key with the admin role (`caller_is_admin`),
whose label is stored under its own name. A request that does not exist and one another key made
get the same 404, word for word, after the same single ledger read: a key learns nothing about
other keys' requests, not even that an id is taken.
A request can be labelled once it has settled (a stream: after its last chunk).

Each giver may give one request up to `MAX_LABELS_PER_REQUEST` labels: counted per key, so a
client filling its share cannot lock a reviewer out, and what the answer's `labels` says is the
caller's own count (a client does not learn that a reviewer labelled its request). A label counts
against its key's (and team's) request rate, as any call does (`Accounting.admit_call`), before
the ledger is read: a key allowed 2 requests a minute makes 2 calls a minute, labels or not.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from router.admission.auth import Principal, is_admin
from router.api.deps import AnyPrincipalDep, ServicesDep, get_principal
from router.api.responses import new_id
from router.errors import NotFoundError, RequestError, TierrouteError, UnavailableError
from router.ledger.entries import Feedback
from router.quality.feedback import ADMIN, CLIENT, answered, is_right

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")

MAX_ID_CHARS = 128  # request ids are 'chatcmpl-' or 'cmpl-' and 24 hex digits
MAX_LABEL_CHARS = 64
MAX_COMMENT_CHARS = 2000
# past this a giver's labels of one request are refused: the table cannot be grown without bound
# (a request holds at most this many per key that may label it: its own key and the admin keys)
MAX_LABELS_PER_REQUEST = 100


def caller_is_admin(principal: Principal) -> bool:
    """Whether the caller may label any key's requests: it holds an admin key (docs/admin.md)."""
    return is_admin(principal)


class NotFound(NotFoundError):
    """The request is unknown, or another key's: the same answer for both (404)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"No request '{request_id}' was found for this API key.", param="request_id", code="request_not_found"
        )


def _printable(value: str, name: str, *, newlines: bool = False) -> str:
    # control characters have no place in an id or a label name; NUL is refused by PostgreSQL's TEXT
    allowed = "\n\r\t" if newlines else ""
    if any(ord(c) < 32 and c not in allowed for c in value) or "\x7f" in value:
        raise ValueError(f"{name} must not contain control characters")
    return value


class FeedbackRequest(BaseModel):
    """The body of POST /v1/feedback. Unknown fields are refused: a misspelt `score` must not pass."""

    model_config = ConfigDict(extra="forbid")

    request_id: StrictStr = Field(min_length=1, max_length=MAX_ID_CHARS)
    score: float = Field(description="0 (wrong) to 1 (right), or true / false")
    label: StrictStr | None = Field(None, min_length=1, max_length=MAX_LABEL_CHARS)
    comment: StrictStr | None = Field(None, max_length=MAX_COMMENT_CHARS)

    @field_validator("score", mode="before")
    @classmethod
    def _score(cls, v: Any) -> float:
        if isinstance(v, bool):
            return 1.0 if v else 0.0
        if not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= 1:
            raise ValueError("score must be a number from 0 to 1, or a boolean")
        return float(v)

    @field_validator("request_id", "label")
    @classmethod
    def _no_controls(cls, v: str | None) -> str | None:
        return None if v is None else _printable(v, "the value")

    @field_validator("comment")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        return None if v is None else _printable(v, "comment", newlines=True)


@router.post("/feedback")
async def post_feedback(body: FeedbackRequest, services: ServicesDep, principal: AnyPrincipalDep) -> dict[str, Any]:
    if not caller_is_admin(principal):
        await get_principal(principal)  # neither admin nor client: the 403 every /v1 route gives
    ledger = services.accounting.ledger
    if ledger is None:
        raise RequestError(
            "Feedback is kept in the ledger, and this service runs without one (ledger.enabled = false).",
            code="feedback_unavailable",
        )
    feedback_id = new_id("fb")
    await services.accounting.admit_call(principal, feedback_id)  # 429 before any ledger work
    try:
        entry = await ledger.entry(body.request_id)
    except TierrouteError:
        raise
    except Exception as exc:
        log.error("feedback: ledger read failed: %s", exc)
        raise UnavailableError("The ledger cannot be read now; send the feedback again later.", 5.0) from None
    if entry is None or (entry.key_id != principal.key_id and not caller_is_admin(principal)):
        raise NotFound(body.request_id)
    fb = Feedback(
        feedback_id=feedback_id,
        request_id=entry.request_id,
        ts=time.time(),
        key_id=principal.key_id,
        score=body.score,
        label=body.label,
        comment=body.comment,
        role=ADMIN if caller_is_admin(principal) else CLIENT,
        team=principal.team,
    )
    try:
        # counted and written in one transaction: a burst of labels cannot all see room under the
        # cap, nor several of them be the request's first (the one drift counts)
        earlier = await ledger.record_feedback(fb, limit=MAX_LABELS_PER_REQUEST)
        if earlier.giver >= MAX_LABELS_PER_REQUEST:
            raise RequestError(
                f"This key has given request '{entry.request_id}' {MAX_LABELS_PER_REQUEST} labels; "
                "it takes no more from it.",
                param="request_id",
                code="too_many_labels",
            )
    except TierrouteError:
        raise
    except Exception as exc:
        log.error("feedback: ledger write failed: %s", exc)
        raise UnavailableError("The ledger cannot be written now; send the feedback again later.", 5.0) from None
    about = answered(entry)
    if earlier.request == 0 and about is not None:
        services.shadow.observe_feedback(about.tier, about.task, is_right(fb.score), fb.ts)
    return {
        "object": "feedback",
        "id": fb.feedback_id,
        "request_id": fb.request_id,
        "created": int(fb.ts),
        "score": fb.score,
        "label": fb.label,
        "comment": fb.comment,
        "labels": earlier.giver + 1,  # the caller's labels of this request so far, this one included
    }
