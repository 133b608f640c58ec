"""The `learned` verifier: the probability, estimated from what the cascade has once a tier has
answered, that the answer is right (the model and its file format: `router.learned.estimators`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.generation import Generation, GenerationRequest
from router.learned.estimators import Estimator, EstimatorError, load_estimator
from verifiers.base import Score, Verifier, VerifierContext, VerifierCost, VerifierError, uses_a_model, worst_cost


async def score_or_zero(verifier: Verifier, request: GenerationRequest, candidate: Generation) -> Score:
    """A feature verifier's score; one that fails on an answer is unsure: 0, saying why (as in eval runs)."""
    try:
        return await verifier.score(request, candidate)
    except Exception as exc:  # noqa: BLE001
        return Score(0.0, f"verifier error: {type(exc).__name__}: {exc}"[:200])


# ---- the learned verifier ------------------------------------------------------------------------------


class LearnedVerifier:
    """Scores an answer with the probability, estimated from what the cascade has, that it is
    right. Computes the scores of the verifiers its features name itself, concurrently, and adds
    their cost to its own; a verifier that fails on an answer counts as 0 (as in eval runs)."""

    def __init__(
        self, estimator: Estimator, tier: str, members: Sequence[tuple[str, Verifier]], name: str = "learned"
    ) -> None:
        self.estimator = estimator
        self.tier = tier
        self.model = estimator.model_for(tier)
        self.members = list(members)
        self.name = name

    @property
    def uses_model(self) -> bool:
        """Whether any feature's verifier asks a tier's model for work (it runs them all)."""
        return any(uses_a_model(v) for _, v in self.members)

    def worst_cost(self, request: GenerationRequest) -> VerifierCost | None:
        """Its features' worst costs together (it runs them all); None if one does not say."""
        total = VerifierCost()
        for _, v in self.members:
            found = worst_cost(v, request)
            if found is None:
                return None
            total = total + found
        return total

    @classmethod
    def load(
        cls,
        artifact: Path | str,
        sha256: str,
        ctx: VerifierContext,
        *,
        name: str = "learned",
    ) -> LearnedVerifier:
        """Its feature verifiers come from `ctx.registry` (a tier's SharedRegistry in the service)."""
        from verifiers.base import Registry

        est = load_estimator(artifact, sha256, "verifier")
        reg = ctx.registry or Registry.from_entry_points()
        members = []
        for ref in est.spec.verifiers:
            if ref.name == "learned":
                raise EstimatorError("a learned verifier cannot read another learned verifier's score")
            try:
                members.append((ref.label, reg.create(ref.name, dict(ref.params), ctx)))
            except VerifierError as exc:
                raise EstimatorError(f"feature verifier '{ref.label}': {exc}") from None
        return cls(est, ctx.tier, members, name)

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        t0 = time.monotonic()
        results = await asyncio.gather(*(score_or_zero(v, request, candidate) for _, v in self.members))
        scores = {label: s.value for (label, _), s in zip(self.members, results, strict=True)}
        cost = VerifierCost()
        for s in results:
            cost = cost + s.cost
        x = self.estimator.spec.vector(request, candidate, scores)
        p = min(1.0, max(0.0, float(self.model.probability(x))))
        details = {
            "estimator_version": self.estimator.version,
            "probability": round(p, 6),
            "tier_model": self.tier,
            "features": {label: None if v is None else round(v, 6) for label, v in scores.items()},
            "verify_ms": round((time.monotonic() - t0) * 1000, 1),
        }
        return Score(p, f"estimated P(right) {p:.3f} ({self.estimator.version})", details, cost)


def make_learned(params: dict[str, Any], ctx: VerifierContext) -> LearnedVerifier:
    """`params = {artifact = "path/learned.json", sha256 = "<64 hex>"}`, optionally `name`."""
    unknown = set(params) - {"artifact", "sha256", "name"}
    if unknown:
        raise TypeError(f"unexpected param(s) {', '.join(sorted(unknown))}; learned takes artifact, sha256, name")
    if not isinstance(params.get("artifact"), str) or not params["artifact"]:
        raise TypeError("artifact must be the path of the estimator file")
    if "sha256" not in params:
        raise TypeError("sha256 is required: the estimator file's hash, so a tampered file is refused")
    name = params.get("name", "learned")
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty string")
    return LearnedVerifier.load(params["artifact"], params["sha256"], ctx, name=name)
