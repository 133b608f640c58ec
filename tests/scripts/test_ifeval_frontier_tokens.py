"""`scripts/ifeval_frontier_tokens.py`: the committed token estimates of GPT-4's IFEval tier are
what the script counts with the small tier's real vocabulary, for every one of the 541 items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.models.catalog import CATALOG, ModelStore
from scripts.ifeval_frontier_tokens import TOKENIZER_MODEL, Tokens, count

DATA = Path(__file__).resolve().parents[2] / "evals" / "data" / "ifeval"


@pytest.mark.slow  # loads the vocabulary of a real model (about a second)
@pytest.mark.skipif(
    not ModelStore().path_of(CATALOG[TOKENIZER_MODEL]).exists(), reason="the Qwen2.5-Coder-0.5B model is not pulled"
)
def test_the_committed_token_file_is_what_the_script_counts() -> None:
    committed = json.loads((DATA / "frontier_tokens.json").read_text(encoding="utf-8"))
    assert committed["tokenizer"]["model"] == TOKENIZER_MODEL
    assert committed["tokenizer"]["sha256"] == CATALOG[TOKENIZER_MODEL].sha256
    counted = count(Tokens(), DATA)
    assert len(counted) == 541 and counted == committed["items"]
