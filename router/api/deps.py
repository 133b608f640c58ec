"""What routes depend on: the services built once per app, and the caller's identity.

Kept apart from the app factory so the routes and the factory import this module and not each
other.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from router.admission.accounting import Accounting
from router.admission.auth import Authenticator, Principal
from router.cache.service import ResponseCache
from router.config import Settings
from router.engine import Engine
from router.quality.shadow import ShadowService


class Services:
    """Everything a route needs, built once per app."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.auth = Authenticator(settings.server)
        self.accounting = Accounting(settings, engine)
        self.shadow = ShadowService(
            settings, engine.cascade, self.accounting.ledger, self.accounting.metrics, sandboxes=engine.sandboxes
        )
        self.cache = ResponseCache(settings, self.accounting.ledger, self.accounting.metrics.registry)


def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(request: Request, services: ServicesDep) -> Principal:
    return services.auth.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]
