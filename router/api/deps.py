"""What routes depend on: the services built once per app, and the caller's identity.

Kept apart from the app factory so the routes and the factory import this module and not each
other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Depends, Request

from router.accounting import Accounting, Ticket
from router.auth import Authenticator, Principal
from router.cascade import CascadeResult, Tier
from router.config import Settings
from router.engine import Engine
from router.generation import GenerationRequest


class Services:
    """Everything a route needs, built once per app."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.auth = Authenticator(settings.server)
        self.accounting = Accounting(settings, engine)

    def admit(
        self,
        principal: Principal,
        request_id: str,
        request: GenerationRequest,
        plan: Sequence[Tier],
        model: str,
        *,
        stream: bool,
    ) -> Ticket:
        """Budget and rate checks before any generation; returns a ticket to release at the end."""
        return self.accounting.admit(principal, request_id, request, plan, model, stream=stream)

    async def record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        """Commit a settled request to the ledger, charge its key, count its metrics."""
        await self.accounting.record(principal, ticket, result)


def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(request: Request, services: ServicesDep) -> Principal:
    return services.auth.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]
