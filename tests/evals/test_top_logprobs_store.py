"""Top-k alternatives in eval runs: stored with each generation, restored into the Generation the
verifiers score from the cache, asked for only by suites that set `top_logprobs` (MMLU), so the
committed GSM8K and HumanEval runs keep their fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.runner import build_request, tier_fingerprint
from evals.store import GenerationRecord, RunStore, generation_key
from evals.suites.base import AnswerKey, Item
from evals.suites.gsm8k import GSM8K
from evals.suites.humaneval import HumanEval
from evals.suites.mmlu import MMLU
from router.config import load_settings
from router.generation import Generation, Message, TokenLogprob
from verifiers.choice import ChoiceVerifier

ROOT = Path(__file__).resolve().parents[2]
TOPS = (
    TokenLogprob(" B", -0.123456789, ((" B", -0.123456789), (" A", -2.5), ("(C", -3.0))),
    TokenLogprob(".", -0.01, ()),
)


def generation(tops: tuple[TokenLogprob, ...] | None) -> Generation:
    return Generation(" B.", "stop", 30, 2, (-0.123456789, -0.01), 0.2, top_logprobs=tops, model="m")


async def test_stored_and_restored_as_the_verifiers_see_it(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.add_generation(GenerationRecord.from_generation("k1", "small", "q1", generation(TOPS)))
        store.add_generation(GenerationRecord.from_generation("k2", "small", "q2", generation(None)))
    loaded = RunStore(tmp_path)
    restored = loaded.generations.records["k1"].to_generation()
    assert restored.top_logprobs == (
        TokenLogprob(" B", -0.1235, ((" B", -0.1235), (" A", -2.5), ("(C", -3.0))),
        TokenLogprob(".", -0.01, ()),
    )
    assert loaded.generations.records["k2"].to_generation().top_logprobs is None
    # a score from the cache reads the same numbers as one computed when the answer was made
    fresh = GenerationRecord.from_generation("k1", "small", "q1", generation(TOPS)).to_generation()
    req = build_request(MMLU(), _item(), load_settings(ROOT / "config.toml").tiers[0])
    assert await ChoiceVerifier().score(req, restored) == await ChoiceVerifier().score(req, fresh)


def test_records_written_before_the_field_still_load(tmp_path: Path) -> None:
    old = {
        "key": "k",
        "tier": "small",
        "item": "q",
        "model": "m",
        "text": "A",
        "finish_reason": "stop",
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "latency_s": 0.1,
        "logprobs": [-0.5],
    }
    (tmp_path / "generations.jsonl").write_text(json.dumps(old) + "\n")
    gen = RunStore(tmp_path).generations.records["k"].to_generation()
    assert gen.top_logprobs is None and gen.token_logprobs == (-0.5,)


def _item() -> Item:
    return Item("x", (Message("user", "Which? A. a B. b C. c D. d"),), AnswerKey(reference="B"))


@pytest.mark.parametrize("suite", [GSM8K(), HumanEval()], ids=["gsm8k", "humaneval"])
def test_committed_runs_without_top_k_keep_their_fingerprints(suite: GSM8K | HumanEval) -> None:
    settings = load_settings(ROOT / "config.toml")
    manifest = json.loads((ROOT / "evals" / "results" / suite.name / "manifest.json").read_text())
    tiers = {t.name: t for t in settings.tiers}
    for tier in manifest["tiers"]:
        assert tier_fingerprint(suite, tiers[tier["name"]]) == tier["fingerprint"]
    assert build_request(suite, _item(), settings.tiers[0]).top_logprobs == 0


def test_mmlu_asks_for_five_alternatives_and_its_committed_run_has_them() -> None:
    settings = load_settings(ROOT / "config.toml")
    store = RunStore(ROOT / "evals" / "results" / "mmlu")
    manifest = store.manifest()
    tiers = {t.name: t for t in settings.tiers}
    assert MMLU.top_logprobs == 5
    assert build_request(MMLU(), _item(), settings.tiers[0]).top_logprobs == 5
    without = type("MMLUWithoutTopK", (MMLU,), {"top_logprobs": 0})()
    for tier in manifest["tiers"]:
        # the committed run was generated asking for them: its fingerprint is the top-k one
        assert tier_fingerprint(MMLU(), tiers[tier["name"]]) == tier["fingerprint"]
        assert tier_fingerprint(without, tiers[tier["name"]]) != tier["fingerprint"]
        for entry in manifest["items"]:
            rec = store.generations.records[generation_key(tier["fingerprint"], entry["prompt_sha"])]
            assert rec.top_logprobs and len(rec.top_logprobs[0][2]) == 5


def test_graded_walks_the_runs_own_items_by_the_current_grader() -> None:
    store = RunStore(ROOT / "evals" / "results" / "gsm8k")
    manifest = store.manifest()
    seen = list(store.graded())
    # every tier answered and was graded on every item; a regraded run's older grades are not read
    assert len(seen) == len(manifest["tiers"]) * len(manifest["items"])
    assert {tier for tier, _, _, _ in seen} == {t["name"] for t in manifest["tiers"]}
    assert all(grade.gen == rec.key for _, _, rec, grade in seen)
    assert len({(tier, entry["id"]) for tier, entry, _, _ in seen}) == len(seen)
