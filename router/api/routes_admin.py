"""The admin API under /admin/: keys, teams and end users' limits, their spend, and the audit log.

Every route depends on `AdminDep`: a key with the admin role, else 401 (no or a wrong key) or 403
(a client key). The routes are thin: each calls one `router.control.admin.ControlPlane` operation
(the same ones `tierroute keys ...` calls) off the event loop, and that operation writes its audit
row. A created key is in the response once and nowhere else: not in the database (its hash is),
not in the audit row, not in a log line.

The OpenAPI schema lists the errors each route really gives, in OpenAI's shape (`ErrorResponse`):
FastAPI's default 422 `HTTPValidationError` is never sent (a bad body is a 400 here, as every
error is in `router.api.errors`), and declaring a `default` response is what keeps FastAPI from
advertising it. docs/admin-openapi.json is this router's schema, committed so that a reader sees
it without a running service (`scripts/gen_admin_openapi.py` writes it; a test compares).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from router.api.deps import AdminDep, Services, ServicesDep
from router.control.admin import ControlPlane
from router.control.records import MAX_WHOLE_LIMIT, Limits
from router.control.store import AUDIT_PAGE_MAX
from router.errors import RequestError


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="'invalid_request_error', 'permission_error' or 'server_error'.")
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error, as OpenAI's API shapes its own."""

    error: ErrorDetail


def _errors(*extra: int) -> dict[int | str, dict[str, Any]]:
    """The errors of a route: those of every admin route, and `extra` (404, 409) where it has them."""
    said = {
        400: "A bad body or value (a name, model, limit or expiry), or no ledger database (`admin_unavailable`).",
        401: "No key, or a wrong, revoked or expired one (`invalid_api_key`).",
        403: "A key without the admin role (`not_an_admin_key`).",
        404: "No key, team or user limits by that name (`not_found`).",
        409: "The name is taken; a revoked key keeps its name (`conflict`).",
    }
    found: dict[int | str, dict[str, Any]] = {
        c: {"model": ErrorResponse, "description": said[c]} for c in (400, 401, 403, *extra)
    }
    found["default"] = {
        "model": ErrorResponse,
        "description": "Any other error: 413 for an oversized body, 500 for a failure (the database, say).",
    }
    return found


router = APIRouter(prefix="/admin", tags=["admin"], responses=_errors())

Role = Literal["client", "admin", "metrics", "report"]


def _client_only() -> list[Role]:
    return ["client"]


class _Body(BaseModel):
    # strict: a JSON value of another type is a 400, not coerced (`"allow_tests": "yes"` is not
    # true, and `"expires_at": true` is not the unix time 1, nor `"usd_per_day": true` a $1 budget)
    model_config = ConfigDict(extra="forbid", strict=True)


class LimitFields(_Body):
    usd_per_day: float | None = Field(None, ge=0, description="Budget per UTC day, in USD; null: none.")
    usd_per_month: float | None = Field(None, ge=0, description="Budget per UTC month, in USD; null: none.")
    requests_per_minute: int | None = Field(
        None, ge=1, le=MAX_WHOLE_LIMIT, description="Requests in any 60 s; null: none."
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=MAX_WHOLE_LIMIT,
        description="Input + output tokens in any 60 s (reserved at admission); null: none.",
    )

    def limits(self) -> Limits:
        return Limits(self.usd_per_day, self.usd_per_month, self.requests_per_minute, self.tokens_per_minute)


class KeyCreate(LimitFields):
    name: str = Field(description="1-64 letters, digits and _.@-: what the ledger, logs and metrics call the key.")
    roles: list[Role] = Field(
        default_factory=_client_only,
        min_length=1,
        description="'client': the /v1 API; 'admin': this API; 'metrics': /metrics only (a scraper's key); "
        "'report': the dashboard under /ui/ only (read-only). An admin key sends completions only with 'client' too.",
    )
    team: str | None = Field(None, description="The team it belongs to (at most one); its limits apply too.")
    models: list[str] | None = Field(None, description="Models it may ask for ('auto', tier names); null: all.")
    allow_tests: bool = Field(False, description="May send tierroute.tests (code run on this host, sandboxed).")
    expires_at: float | None = Field(None, description="Unix seconds after which it is refused; null: never.")


class KeyUpdate(LimitFields):
    """Only the fields sent change; null clears a limit, the team, or the model list (all models)."""

    roles: list[Role] | None = None
    team: str | None = None
    models: list[str] | None = None
    allow_tests: bool | None = None
    expires_at: float | None = None


class KeyOut(BaseModel):
    name: str
    roles: list[str]
    team: str | None
    usd_per_day: float | None
    usd_per_month: float | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    models: list[str] | None
    allow_tests: bool
    expires_at: float | None
    revoked_at: float | None
    created_at: float
    created_by: str


class KeyCreated(KeyOut):
    key: str = Field(
        description="The API key: shown this once, never stored (the database keeps its SHA-256, 'sha256$...')."
    )


class TeamCreate(LimitFields):
    name: str = Field(description="1-64 letters, digits and _.@-.")


class TeamOut(BaseModel):
    name: str
    usd_per_day: float | None
    usd_per_month: float | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    created_at: float


class UserOut(BaseModel):
    team: str
    user: str = Field(description="OpenAI's `user` field; '*' is the default for every user without a row.")
    usd_per_day: float | None
    usd_per_month: float | None
    requests_per_minute: int | None
    tokens_per_minute: int | None


class SpendOut(BaseModel):
    key: str | None = None
    team: str | None = None
    user: str | None = None
    usd_today: float = Field(description="Settled cost since 00:00 UTC.")
    usd_this_month: float = Field(description="Settled cost since the 1st, 00:00 UTC.")
    requests_today: int
    tokens_today: int = Field(description="Input + output tokens of today's settled requests.")
    usd_reserved_in_flight: float = Field(description="Reservations of requests not yet settled.")


class AuditOut(BaseModel):
    ts: float
    actor: str = Field(description="The admin key's name, 'cli:USER', or 'config' (an imported config key).")
    action: str
    target: str
    detail: dict[str, Any]


class Listing(BaseModel):
    object: Literal["list"] = "list"


class KeyList(Listing):
    data: list[KeyOut]


class TeamList(Listing):
    data: list[TeamOut]


class UserList(Listing):
    data: list[UserOut]


class AuditList(Listing):
    data: list[AuditOut]
    has_more: bool = Field(description="Whether older rows are left: ask again with `cursor` = next_cursor.")
    next_cursor: str | None = Field(description="Where the next page starts (opaque); null on the last page.")


def _plane(services: Services) -> ControlPlane:
    if services.keys.plane is None:
        raise RequestError(
            "The admin API needs the ledger's database (ledger.enabled = true): keys live there.",
            code="admin_unavailable",
        )
    return services.keys.plane


@router.post("/keys", status_code=201, response_model=KeyCreated, responses=_errors(404, 409))
async def create_key(body: KeyCreate, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    plane = _plane(services)
    key, found = await asyncio.to_thread(
        plane.create_key,
        admin.key_id,
        body.name,
        roles=body.roles,
        team=body.team,
        limits=body.limits(),
        models=body.models,
        allow_tests=body.allow_tests,
        expires_at=body.expires_at,
    )
    return {**found.public(), "key": key}


@router.get("/keys", response_model=KeyList)
async def list_keys(services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    snapshot = await asyncio.to_thread(_plane(services).store.snapshot)
    return {"object": "list", "data": [k.public() for k in sorted(snapshot.keys.values(), key=lambda k: k.name)]}


@router.get("/keys/{name}", response_model=KeyOut, responses=_errors(404))
async def get_key(name: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    return (await asyncio.to_thread(_plane(services).key, name)).public()


@router.patch("/keys/{name}", response_model=KeyOut, responses=_errors(404))
async def update_key(name: str, body: KeyUpdate, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    changes = {f: getattr(body, f) for f in body.model_fields_set}
    return (await asyncio.to_thread(_plane(services).update_key, admin.key_id, name, changes)).public()


@router.post("/keys/{name}/revoke", response_model=KeyOut, responses=_errors(404))
async def revoke_key(name: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    """Refused at once on this replica; on the others within `server.keys_poll_s` + 1 s (docs/keys.md)."""
    return (await asyncio.to_thread(_plane(services).revoke_key, admin.key_id, name)).public()


@router.get("/keys/{name}/spend", response_model=SpendOut, responses=_errors(404))
async def key_spend(name: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    return await asyncio.to_thread(lambda: _plane(services).spend(key=name))


@router.post("/teams", status_code=201, response_model=TeamOut, responses=_errors(409))
async def create_team(body: TeamCreate, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    plane = _plane(services)
    return (await asyncio.to_thread(plane.create_team, admin.key_id, body.name, body.limits())).public()


@router.get("/teams", response_model=TeamList)
async def list_teams(services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    teams = await asyncio.to_thread(_plane(services).teams)
    return {"object": "list", "data": [t.public() for t in teams]}


@router.get("/teams/{name}", response_model=TeamOut, responses=_errors(404))
async def get_team(name: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    return (await asyncio.to_thread(_plane(services).team, name)).public()


@router.patch("/teams/{name}", response_model=TeamOut, responses=_errors(404))
async def update_team(name: str, body: LimitFields, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    changes = {f: getattr(body, f) for f in body.model_fields_set}
    return (await asyncio.to_thread(_plane(services).update_team, admin.key_id, name, changes)).public()


@router.get("/teams/{name}/spend", response_model=SpendOut, responses=_errors(404))
async def team_spend(name: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    return await asyncio.to_thread(lambda: _plane(services).spend(team=name))


@router.get("/teams/{team}/users", response_model=UserList, responses=_errors(404))
async def list_users(team: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    plane = _plane(services)
    await asyncio.to_thread(plane.team, team)  # 404 for an unknown team
    snapshot = await asyncio.to_thread(plane.store.snapshot)
    found = sorted((u for (t, _), u in snapshot.users.items() if t == team), key=lambda u: u.user)
    return {"object": "list", "data": [u.public() for u in found]}


@router.put("/teams/{team}/users/{user}", response_model=UserOut, responses=_errors(404))
async def set_user_limits(
    team: str, user: str, body: LimitFields, services: ServicesDep, admin: AdminDep
) -> dict[str, Any]:
    """The user's limits within the team (replacing any it had); user '*' sets every user's default."""
    plane = _plane(services)
    return (await asyncio.to_thread(plane.set_user_limits, admin.key_id, team, user, body.limits())).public()


@router.delete("/teams/{team}/users/{user}", status_code=204, responses=_errors(404))
async def delete_user_limits(team: str, user: str, services: ServicesDep, admin: AdminDep) -> None:
    await asyncio.to_thread(_plane(services).delete_user_limits, admin.key_id, team, user)


@router.get("/teams/{team}/users/{user}/spend", response_model=SpendOut, responses=_errors(404))
async def user_spend(team: str, user: str, services: ServicesDep, admin: AdminDep) -> dict[str, Any]:
    return await asyncio.to_thread(lambda: _plane(services).spend(team=team, user=user))


@router.get("/audit", response_model=AuditList)
async def audit(
    services: ServicesDep,
    admin: AdminDep,
    since: Annotated[float | None, Query(description="Only rows at or after this unix time.")] = None,
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MAX, description="Rows in this page.")] = AUDIT_PAGE_MAX,
    cursor: Annotated[
        str | None, Query(max_length=64, description="The previous page's next_cursor; none: the newest rows.")
    ] = None,
) -> dict[str, Any]:
    """Every admin action, newest first, a page at a time: who, what, to what, when. Follow
    `next_cursor` until `has_more` is false to read every row."""
    page = await asyncio.to_thread(_plane(services).store.audit_page, since, limit, cursor)
    return {
        "object": "list",
        "data": page.rows,
        "has_more": page.next_cursor is not None,
        "next_cursor": page.next_cursor,
    }
