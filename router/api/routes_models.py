"""GET /v1/models: `auto` (the cascade) and each tier, as far as the caller's key may use them.

A key held to some models (`models` in its record) sees those alone, in the list, as cards, and
in the 404 for any other name, which reads the same whether that model exists or not: a card
carries the tier's upstream model, price and threshold, which are the operator's, not every
tenant's, to read."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from router.api.deps import PrincipalDep, ServicesDep
from router.errors import UnknownModelError
from router.policy import describe

router = APIRouter(prefix="/v1")


def _card(services: ServicesDep, name: str) -> dict[str, Any]:
    created = int(time.time())
    if name == "auto":
        tiers = [t.name for t in services.settings.tiers]
        return {
            "id": "auto",
            "object": "model",
            "created": created,
            "owned_by": "tierroute",
            "tierroute": {"cascade": tiers},
        }
    tier = services.settings.tier(name)
    section = tier.llamacpp or tier.openai
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "tierroute",
        "tierroute": {
            "backend": tier.backend,
            "model": section.model if section else None,
            "price": describe(tier.price),
            "threshold": tier.threshold,
        },
    }


@router.get("/models")
async def list_models(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    names = principal.visible(services.engine.cascade.model_names())
    return {"object": "list", "data": [_card(services, n) for n in names]}


@router.get("/models/{model}")
async def get_model(model: str, services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    names = principal.visible(services.engine.cascade.model_names())
    if model not in names:
        raise UnknownModelError(model, names, restricted=principal.models is not None)
    return _card(services, model)
