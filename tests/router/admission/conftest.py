"""Fixtures shared by the admission tests."""

from __future__ import annotations

import pytest

from router.admission import auth as auth_module


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stored hashes the key checks compare presented keys with, in order: what a check
    costs (a salted hash is one SHA-256 each; an unsalted one is found without comparing)."""
    seen: list[str] = []
    real = auth_module._matches

    def counting(key: str, stored: str) -> bool:
        seen.append(stored)
        return real(key, stored)

    monkeypatch.setattr(auth_module, "_matches", counting)
    return seen
