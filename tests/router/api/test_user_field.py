"""A request's `user` is held to the rule an admin's user names are: printable text, no control,
format or bidi characters, and not '*' (a team's row for every user). The outside review of issue
38's fixes stored `a\\u202eevil` and `*` from a client's request in the ledger's user column, which
feeds the per-user spend subjects, while the admin API refused the same names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.accounting import chat, read_ledger, running
from tests.support.cache import Counting
from tests.support.config import write_config
from tests.support.model import SMOL

BAD = ["a\u202eevil", "a\u2028b", "a\x85b", "a\u200bb", "a\x9b[31mb", "a\nb", "*"]
FINE = ["ana", "Zoë Müller", "用户-7", "a b"]


@pytest.mark.parametrize("surface", ["/v1/chat/completions", "/v1/completions"])
async def test_a_user_that_is_not_plain_text_is_refused_and_plain_ones_are_served(tmp_path: Path, surface: str) -> None:
    text = (
        f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp_path / "l.sqlite3"}"\n'
        '[[tiers]]\nname = "small"\nbackend = "llamacpp"\nmax_tokens = 64\n'
        f'[tiers.llamacpp]\nmodel = "{SMOL}"\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 0.60\nusd_per_1m_output_tokens = 2.40\n"
    )
    cfg = write_config(tmp_path / "config.toml", text)

    def body(user: str) -> dict[str, object]:
        if surface.endswith("chat/completions"):
            return {**chat("Hi"), "user": user}
        return {"model": "auto", "prompt": "Hi", "max_tokens": 8, "user": user}

    async with running(cfg, backends={"small": Counting("small")}) as client:
        refused = [await client.post(surface, json=body(u)) for u in BAD]
        served = [await client.post(surface, json=body(u)) for u in FINE]
    for user, r in zip(BAD, refused, strict=True):
        assert r.status_code == 400 and r.json()["error"]["param"] == "user", (user, r.text)
        assert user not in r.text or user == "*"
    assert [r.status_code for r in served] == [200] * len(FINE)
    assert sorted(row.user for row in read_ledger(tmp_path / "l.sqlite3").values()) == sorted(FINE)
