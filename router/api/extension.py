"""The `tierroute` object every response carries: which tier answered, why, and what it cost.

Built here, beside OpenAI's shapes (`router.api.responses`), from what the cascade found: the
cascade decides, this module only shows. A cache hit's object says whose stored answer it is and
that it cost nothing. Both carry what the request's stages said (`stages`), when any did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.cache.answer import CachedAnswer
    from router.cascade import Attempt, CascadeResult


def attempt_json(a: Attempt) -> dict[str, Any]:
    """One attempt as the tierroute object shows it: its tier, decision, scores, tokens and cost."""
    g = a.generation
    return {
        "tier": a.tier,
        "deployment": g.deployment_shown if g else None,  # which of the tier's deployments answered
        "accepted": a.accepted,
        "score": None if a.score is None else round(a.score, 6),
        "threshold": a.threshold,
        "reason": a.reason,
        "error": a.error,
        "skipped": a.skipped,
        "abandoned": a.abandoned,
        "prerouter": a.prerouter,
        "scores": {
            name: {
                "score": None if s.value is None else round(s.value, 6),
                "reason": s.reason,
                "details": s.details,
            }
            for name, s in a.scores.items()
        },
        "tool_check": a.tool_check,
        "prompt_tokens": g.prompt_tokens if g else 0,
        "completion_tokens": g.completion_tokens if g else 0,
        "finish_reason": g.finish_reason if g else None,
        # decoded under the response_format's grammar; an upstream asked to enforce it: null
        "constrained": g.constrained if g else None,
        # the format verifier's check of the request's response_format: null when none ran
        "format_ok": next(
            (
                s.value == 1.0
                for s in a.scores.values()
                if s.details.get("check") == "response_format" and s.value is not None
            ),
            None,
        ),
        "latency_ms": round(g.latency_s * 1000, 1) if g else None,
        "verify_ms": round(a.verify_s * 1000, 1),
        "cost_usd": a.cost_usd,
        "verifier_cost_usd": a.verifier_cost_usd,
        "verifier_tokens": a.verifier_cost.tokens,
        # speculative decoding: tokens drafted and accepted, all sources together and per
        # source ("model": a draft model, "rejected": the previous tier's rejected answer,
        # "scored": its start, already verified by this tier's cross_tier scoring pass)
        "draft_tokens": sum(d[1] for d in g.drafts) if g else 0,
        "draft_accepted": sum(d[2] for d in g.drafts) if g else 0,
        "drafts": {src: {"tokens": t, "accepted": ok} for src, t, ok in g.drafts} if g else {},
    }


def summary(result: CascadeResult) -> dict[str, Any]:
    """The object without the request's id: the answering tier, the task, every attempt, the cost."""
    found = {
        "tier": result.final.tier,
        "deployment": result.final.generation.deployment_shown if result.final.generation else None,
        "task": result.task.task if result.task else None,
        "task_why": result.task.why if result.task else None,
        "escalated": result.escalated,
        "unverified": result.unverified,
        "cost_usd": result.cost_usd,
        "counterfactual_top_tier_usd": result.counterfactual_usd,
        "attempts": [attempt_json(a) for a in result.attempts],
    }
    return found if not result.stages else {**found, "stages": result.stages}


def extension(rid: str, result: CascadeResult, cache: str | None = None) -> dict[str, Any]:
    """The `tierroute` object of a generated answer; with the response cache on, `cache` says what
    it did (miss, bypass, skip)."""
    found = {"request_id": rid, **summary(result)}
    return found if cache is None else {**found, "cache": cache}


def cached_extension(rid: str, hit: CachedAnswer, stages: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `tierroute` object of a stored answer served again: whose it is, and no cost."""
    found: dict[str, Any] = {
        "request_id": rid,
        "cache": "hit",
        "cached_request_id": hit.request_id,
        "tier": hit.tier,
        "task": hit.task,
        "task_why": hit.task_why,
        "escalated": False,
        "unverified": False,
        "cost_usd": 0.0,
        "counterfactual_top_tier_usd": 0.0,
        "attempts": [],
    }
    return found if not stages else {**found, "stages": stages}
