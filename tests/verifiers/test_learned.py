"""The learned verifier's features and artifact: features computed by hand, hashing that does not
depend on the process, an artifact read from numbers alone and refused when its hash is not the
configured one, and the verifier's score with the estimator version and probability it reports."""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from router.generation import GenerationRequest, Message
from router.learned.estimators import EstimatorError, LinearModel, PreRouter, dump_estimator, load_estimator
from router.learned.features import (
    ANSWER_FEATURES,
    PROMPT_FEATURES,
    FeatureSpec,
    VerifierRef,
    gram_bucket,
    hashed_grams,
    logprob_stats,
)
from router.models.wheels import sha256_file
from tests.support.scripted import gen
from verifiers.base import (
    Registry,
    Score,
    SharedRegistry,
    VerifierContext,
    VerifierCost,
    VerifierError,
    VerifierSet,
    WeightedVerifier,
)
from verifiers.learned import LearnedVerifier, make_learned

REQ = GenerationRequest(
    messages=(Message("system", "Be brief."), Message("user", "What is 6 * 7?\nReply 42")), max_tokens=32
)
CONF = VerifierRef("confidence", "confidence", {"stat": "mean"})


def test_logprob_stats_by_hand() -> None:
    lps = [-0.1, -2.0, -0.5, -0.05, float("nan"), -1e9]  # NaN dropped, -1e9 floored at -30
    mean, low, p10, p25, std, below, has = logprob_stats(lps)
    kept = np.array([-0.1, -2.0, -0.5, -0.05, -30.0])
    assert mean == pytest.approx(kept.mean()) and low == -30.0
    assert p10 == pytest.approx(np.percentile(kept, 10)) and p25 == pytest.approx(np.percentile(kept, 25))
    assert std == pytest.approx(kept.std())
    assert below == pytest.approx(2 / 5)  # -2.0 and -30 are below log(0.5); -0.5 is not
    assert has == 1.0
    assert logprob_stats(None) == [0.0] * 7 and logprob_stats([]) == [0.0] * 7


def test_answer_and_prompt_features() -> None:
    spec = FeatureSpec(answer=True, verifiers=(CONF,), n_buckets=16)
    g = gen("The answer is 42", logprobs=(-0.1, -0.2), finish_reason="length")
    x = spec.vector(REQ, g, {"confidence": 0.7})
    assert len(x) == len(spec.names) == len(PROMPT_FEATURES) + len(ANSWER_FEATURES) + 1 + 16
    row = dict(zip(spec.names, x, strict=True))
    text = "What is 6 * 7?\nReply 42"  # the last user message; the system prompt is not read
    assert row["prompt_chars_log"] == pytest.approx(math.log1p(len(text)))
    assert row["prompt_words_log"] == pytest.approx(math.log1p(6))  # What is 6 7 Reply 42
    assert row["prompt_lines_log"] == pytest.approx(math.log1p(2))
    assert row["prompt_messages"] == 2
    assert row["prompt_digit_frac"] == pytest.approx(4 / len(text))
    assert row["finish_length"] == 1.0 and row["lp_mean"] == pytest.approx(-0.15)
    assert row["completion_tokens_log"] == pytest.approx(math.log1p(2))
    assert row["prompt_tokens_log"] == pytest.approx(math.log1p(12))
    assert row["score:confidence"] == 0.7
    grams = x[-16:]
    assert np.linalg.norm(grams) == pytest.approx(1.0)
    assert grams[gram_bucket("6", 16)] > 0 and grams[gram_bucket("reply 42", 16)] > 0
    with pytest.raises(ValueError, match="missing verifier scores: confidence"):
        spec.vector(REQ, g, {})


def test_prompt_only_features_read_no_answer() -> None:
    spec = FeatureSpec(answer=False, n_buckets=8)
    assert len(spec.vector(REQ)) == len(PROMPT_FEATURES) + 8
    with pytest.raises(ValueError, match="prompt-only"):
        FeatureSpec(answer=False, verifiers=(CONF,))


@pytest.mark.slow
def test_gram_hashing_is_the_same_in_every_process() -> None:
    here = hashed_grams("the quick brown fox jumps", 64).tolist()
    code = (
        "import json; from router.learned.features import hashed_grams; "
        "print(json.dumps(hashed_grams('the quick brown fox jumps', 64).tolist()))"
    )
    for seed in ("1", "12345"):  # Python's hash() would differ between these
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=Path(__file__).parents[2],
        )
        assert json.loads(out.stdout) == here


# ---- artifacts ------------------------------------------------------------------------------------------------


def model(spec: FeatureSpec, **weights: float) -> LinearModel:
    """A hand-made model: a weight per named feature, no scaling."""
    coef = np.zeros(len(spec.names))
    for name, w in weights.items():
        coef[spec.names.index(name.replace("__", ":"))] = w
    n = len(spec.names)
    return LinearModel([0.0] * n, [1.0] * n, coef.tolist(), -1.0, 2.0, 0.5, {"kind": "test"})


def write(
    tmp: Path, kind: str = "verifier", spec: FeatureSpec | None = None, tiers: tuple[str, ...] = ("small",)
) -> tuple[Path, str]:
    spec = spec or FeatureSpec(answer=kind == "verifier", verifiers=(CONF,) if kind == "verifier" else (), n_buckets=8)
    weights = {"score__confidence": 3.0} if kind == "verifier" else {"prompt_digit_frac": 10.0}
    path = tmp / f"{kind}.json"
    path.write_bytes(dump_estimator(kind, spec, {t: model(spec, **weights) for t in tiers}, {"runs": ["test"]}))
    return path, sha256_file(path)


def test_the_prediction_is_the_documented_formula(tmp_path: Path) -> None:
    path, sha = write(tmp_path)
    est = load_estimator(path, sha, "verifier")
    assert est.version == f"verifier@{sha[:12]}"
    x = est.spec.vector(REQ, gen("42", (-0.1,)), {"confidence": 0.8})
    m = est.model_for("small")
    t = 2.0 * (3.0 * 0.8 - 1.0) + 0.5
    assert float(m.probability(x)) == pytest.approx(1 / (1 + math.exp(-t)))


def test_same_inputs_same_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert write(tmp_path / "a")[1] == write(tmp_path / "b")[1]


def test_a_tampered_artifact_is_refused(tmp_path: Path) -> None:
    path, sha = write(tmp_path)
    doc = json.loads(path.read_text())
    doc["models"]["small"]["intercept"] = 50.0  # always accept
    path.write_text(json.dumps(doc))
    with pytest.raises(EstimatorError, match="SHA-256 .* is not the configured"):
        load_estimator(path, sha, "verifier")


def test_a_pickle_is_never_unpickled(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self):  # would run on unpickling
            return (Path(tmp_path / "pwned").write_text, ("x",))

    path = tmp_path / "evil.json"
    path.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(EstimatorError, match="not JSON"):
        load_estimator(path, sha256_file(path), "verifier")  # even with its own hash configured
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(kind="prerouter"), "'prerouter' estimator where a 'verifier'"),
        (lambda d: d.update(format_version=2), "format_version"),
        (lambda d: d["models"]["small"].update(coef=[1.0]), "coef must be"),
        (lambda d: d["models"]["small"]["scale"].__setitem__(0, 0.0), "scale must be positive"),
        (lambda d: d["models"]["small"].update(platt_a="1"), "platt_a must be a finite number"),
        (lambda d: d.update(feature_names=["x"]), "feature_names"),
        (lambda d: d.update(models={}), "no models"),
    ],
)
def test_malformed_artifacts_are_refused(tmp_path: Path, edit, message: str) -> None:
    path, _ = write(tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(EstimatorError, match=message):
        load_estimator(path, sha256_file(path), "verifier")


def test_non_finite_numbers_are_refused(tmp_path: Path) -> None:
    path, _ = write(tmp_path)
    path.write_text(path.read_text().replace('"intercept":-1.0', '"intercept":NaN'))
    with pytest.raises(EstimatorError, match="NaN"):
        load_estimator(path, sha256_file(path), "verifier")


def test_bad_hash_and_missing_file(tmp_path: Path) -> None:
    path, _ = write(tmp_path)
    with pytest.raises(EstimatorError, match="64-hex-digit"):
        load_estimator(path, "abc", "verifier")
    with pytest.raises(EstimatorError, match="cannot read"):
        load_estimator(tmp_path / "none.json", "0" * 64, "verifier")


# ---- the verifier ---------------------------------------------------------------------------------------------


async def test_learned_verifier_scores_with_its_own_feature_verifiers(tmp_path: Path) -> None:
    path, sha = write(tmp_path)
    reg = Registry.from_entry_points()
    v = reg.create("learned", {"artifact": str(path), "sha256": sha}, VerifierContext(tier="small"))
    assert isinstance(v, LearnedVerifier) and v.name == "learned"
    s = await v.score(REQ, gen("42", (-0.2, -0.2)))
    conf = math.exp(-0.2)  # the confidence verifier's own score, computed inside
    t = 2.0 * (3.0 * conf - 1.0) + 0.5
    assert s.value == pytest.approx(1 / (1 + math.exp(-t)), abs=1e-6)
    assert s.details["estimator_version"] == f"verifier@{sha[:12]}"
    assert s.details["probability"] == pytest.approx(s.value, abs=1e-6)
    assert s.details["features"] == {"confidence": pytest.approx(conf, abs=1e-6)}
    assert "estimated P(right)" in s.reason


async def test_a_failing_feature_verifier_counts_as_zero(tmp_path: Path) -> None:
    path, sha = write(tmp_path)

    class Broken:
        name = "confidence"

        async def score(self, request, candidate):
            raise RuntimeError("boom")

    reg = Registry()
    reg.register("confidence", lambda params, ctx: Broken())
    v = LearnedVerifier.load(path, sha, VerifierContext(tier="small", registry=reg))
    s = await v.score(REQ, gen("42", (-0.2,)))
    assert s.details["features"] == {"confidence": 0.0}


async def test_a_feature_verifier_the_tier_also_runs_is_scored_once(tmp_path: Path) -> None:
    """A tier running `confidence` and a `learned` verifier that reads `confidence`: built through
    the tier's SharedRegistry (as Engine.from_settings builds tiers) the answer is scored by
    `confidence` once, its cost is charged once, and the scores are those of separate instances."""
    path, sha = write(tmp_path)
    calls = []

    class Counted:
        name = "confidence"

        async def score(self, request, candidate):
            calls.append(candidate)
            await asyncio.sleep(0)
            return Score(0.8, "counted", cost=VerifierCost(seconds=1.0))

    base = Registry()
    base.register("confidence", lambda params, ctx: Counted())
    base.register("learned", make_learned)
    shared = SharedRegistry(base)
    ctx = VerifierContext(tier="small", registry=shared)
    members = [
        WeightedVerifier(shared.create("confidence", {"stat": "mean"}, ctx), 1.0),
        WeightedVerifier(shared.create("learned", {"artifact": str(path), "sha256": sha}, ctx), 1.0),
    ]
    verdict = await VerifierSet(members).score(REQ, gen("42", (-0.2,)))
    assert len(calls) == 1
    assert verdict.cost.seconds == 1.0
    assert verdict.scores["confidence"].value == 0.8
    assert verdict.scores["learned"].details["features"] == {"confidence": 0.8}
    alone = LearnedVerifier.load(path, sha, VerifierContext(tier="small", registry=base))
    assert (await alone.score(REQ, gen("42", (-0.2,)))).value == verdict.scores["learned"].value
    calls.clear()
    await VerifierSet(members).score(REQ, gen("43", (-0.2,)))
    assert len(calls) == 1  # another answer is scored anew


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"artifact": "x.json"}, "sha256 is required"),
        ({"sha256": "0" * 64}, "artifact must be"),
        ({"artifact": "x.json", "sha256": "0" * 64, "threshold": 0.5}, "unexpected param"),
    ],
)
def test_learned_params_are_checked(params: dict, message: str) -> None:
    with pytest.raises(VerifierError, match=message):
        Registry.from_entry_points().create("learned", params, VerifierContext(tier="small"))


def test_a_tier_without_a_model_is_refused_at_start_up(tmp_path: Path) -> None:
    path, sha = write(tmp_path)
    with pytest.raises(VerifierError, match="no model for tier 'medium'; it was trained for small"):
        Registry.from_entry_points().create(
            "learned", {"artifact": str(path), "sha256": sha}, VerifierContext(tier="medium")
        )


def test_the_prerouter_reads_the_prompt_only(tmp_path: Path) -> None:
    path, sha = write(tmp_path, "prerouter")
    pre = PreRouter.load(path, sha, "small", threshold=0.5)
    digits = GenerationRequest(messages=(Message("user", "12345"),))
    words = GenerationRequest(messages=(Message("user", "hello there"),))
    assert pre.probability(digits) > 0.99 > 0.5 > pre.probability(words)
    assert pre.version == f"prerouter@{sha[:12]}"
    with pytest.raises(EstimatorError, match="'prerouter' estimator where a 'verifier'"):
        load_estimator(path, sha, "verifier")
