"""A key held to some models sees only those, on every route: the model list, a model's card
(`/v1/models/{id}`: its upstream model id, price and threshold), and the text of a refusal, which
names the models the key may use and never the others (the outside review read `large`'s card,
and the full tier list from the 404, with a key limited to `small`).

The app runs in-process on a real SQLite ledger; the keys are made through the admin API; the
tiers are a scripted upstream on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.accounting import running
from tests.support.control import bearer, control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)

HIDDEN = ("large", "auto", "scripted", "0.6", "2.4")  # what a `small` key must not read: names, model id, prices


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
async def keys(tmp_path: Path, upstream: FaultUpstream) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
    async with running(cfg) as client:
        for name, models in (("narrow", ["small"]), ("wide", None)):
            r = await client.post("/admin/keys", json={"name": name, "models": models}, headers=bearer(raw["root"]))
            assert r.status_code == 201, r.text
            raw[name] = r.json()["key"]
        yield client, raw


def _reveals(text: str) -> list[str]:
    return [word for word in HIDDEN if word in text]


async def test_a_restricted_key_reads_no_other_tiers_card(keys: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    client, raw = keys
    listed = await client.get("/v1/models", headers=bearer(raw["narrow"]))
    assert [m["id"] for m in listed.json()["data"]] == ["small"]
    own = await client.get("/v1/models/small", headers=bearer(raw["narrow"]))
    assert own.status_code == 200 and own.json()["tierroute"]["model"] == "scripted"
    bodies = []
    for model in ("large", "auto", "no-such-model"):
        r = await client.get(f"/v1/models/{model}", headers=bearer(raw["narrow"]))
        assert r.status_code == 404, (model, r.text)
        error = r.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert error["message"].endswith("Available: small"), error["message"]
        assert not _reveals(error["message"].replace(f"'{model}'", "")), error["message"]
        bodies.append(error["message"].replace(f"'{model}'", "'X'"))
    assert len(set(bodies)) == 1  # a tier that exists and one that does not read the same


async def test_a_restricted_keys_refusal_names_only_its_models(keys: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    client, raw = keys
    said = []
    for model in ("large", "auto", "no-such-model"):
        r = await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4},
            headers=bearer(raw["narrow"]),
        )
        assert r.status_code == 403, (model, r.text)
        error = r.json()["error"]
        assert error["code"] == "model_not_allowed" and error["param"] == "model"
        assert not _reveals(error["message"].replace(f"'{model}'", "")), error["message"]
        said.append((r.status_code, error["message"].replace(f"'{model}'", "'X'")))
    assert len(set(said)) == 1  # whether the model exists is not told either


async def test_an_unrestricted_key_still_sees_every_model(keys: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    client, raw = keys
    listed = await client.get("/v1/models", headers=bearer(raw["wide"]))
    assert [m["id"] for m in listed.json()["data"]] == ["auto", "small", "large"]
    card = await client.get("/v1/models/large", headers=bearer(raw["wide"]))
    assert card.status_code == 200 and card.json()["tierroute"]["backend"] == "openai"
    r = await client.get("/v1/models/no-such-model", headers=bearer(raw["wide"]))
    assert r.status_code == 404 and r.json()["error"]["message"].endswith("Available: auto, small, large")
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4},
        headers=bearer(raw["wide"]),
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
