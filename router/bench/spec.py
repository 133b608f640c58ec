"""`bench spec`: speculative decoding side by side, one local tier plain, drafted, and llama-server.

The variants share one model pair and one set of engine settings, taken from two configs that
differ only in the tier's draft keys (`draft_model`, `draft_max`): the plain config is served as
is, the draft config is served as is, and llama.cpp's own `llama-server` is started on the same
target model, the same draft model, the same threads, context, slots and draft length. Every
variant is a server the bench launches, measures alone and stops, through the sweep's own load
generator (router.bench.sweep), so the figures are the sweep's figures: output tok/s, TTFT and
latency. Each level also reads the server's draft counters (router.bench.drafts), for the
acceptance rate.

A variant that cannot run is reported as skipped with the reason, and the rest still run: a
tierroute whose config refuses `draft_model` (an engine without speculative decoding), or no
llama-server binary (scripts/build_llama_server.sh builds one from the llama.cpp our engine uses).
"""

from __future__ import annotations

import shlex
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.bench.launch import free_port
from router.bench.workload import BenchError, Target

VARIANTS = ("tierroute", "tierroute+draft", "llama-server+draft", "llama-server")
DEFAULT_VARIANTS = VARIANTS[:3]
DRAFT_KEYS = ("draft_model", "draft_max", "draft_p_min", "draft_max_batch", "reuse_rejected")
DEFAULT_DRAFT_MAX = 8  # the engine's default, so llama-server drafts as far when the config is silent


@dataclass(frozen=True)
class Variant:
    """One server to measure, or the reason it cannot be."""

    label: str
    target: Target | None
    skipped: str | None = None

    def describe(self) -> dict[str, Any]:
        if self.target is None:
            return {"label": self.label, "skipped": self.skipped}
        return self.target.describe()


@dataclass(frozen=True)
class Pair:
    """What both engines are given: the tier's models and engine settings, read from the configs."""

    tier: str
    model: Path
    draft_model: Path
    draft_max: int
    n_threads: int
    n_ctx: int
    n_parallel: int

    def describe(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "model": str(self.model),
            "draft_model": str(self.draft_model),
            "draft_max": self.draft_max,
            "n_threads": self.n_threads,
            "n_ctx": self.n_ctx,
            "n_parallel": self.n_parallel,
        }


def _raw_tier(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BenchError(f"{path}: {exc}") from None
    tiers = raw.get("tiers")
    if not isinstance(tiers, list) or len(tiers) != 1 or not isinstance(tiers[0], dict):
        raise BenchError(f"{path}: bench spec measures one tier; give a config with exactly one [[tiers]]")
    tier: dict[str, Any] = tiers[0]
    if tier.get("backend") != "llamacpp" or not isinstance(tier.get("llamacpp"), dict):
        raise BenchError(f"{path}: the tier must be a local one (backend = 'llamacpp', with [tiers.llamacpp])")
    return tier


def _without_draft(tier: dict[str, Any]) -> dict[str, Any]:
    return {**tier, "llamacpp": {k: v for k, v in tier["llamacpp"].items() if k not in DRAFT_KEYS}}


def read_pair(plain_config: Path, draft_config: Path, cache_dir: Path | None = None) -> Pair:
    """The pair both engines run, from the two configs: refused unless they differ only in the
    draft keys, name a draft model, and fix the thread count (0, "the machine's cores", could be
    read differently by the two engines)."""
    from router.errors import TierrouteError
    from router.models.catalog import resolve_model

    plain, draft = _raw_tier(plain_config), _raw_tier(draft_config)
    if any(k in plain["llamacpp"] for k in DRAFT_KEYS):
        raise BenchError(f"{plain_config}: the plain config must not set {', '.join(DRAFT_KEYS)}")
    if _without_draft(draft) != plain:
        raise BenchError(
            f"{draft_config} and {plain_config} must be the same tier but for its draft keys "
            f"({', '.join(DRAFT_KEYS)}), so the comparison isolates drafting"
        )
    engine = plain["llamacpp"]
    if "draft_model" not in draft["llamacpp"]:
        raise BenchError(f"{draft_config}: [tiers.llamacpp] names no draft_model")
    n_threads = int(engine.get("n_threads", 0))
    if n_threads < 1:
        raise BenchError(f"{plain_config}: set n_threads explicitly, so both engines get the same threads")
    try:
        model = resolve_model(str(engine["model"]), cache_dir)
        draft_model = resolve_model(str(draft["llamacpp"]["draft_model"]), cache_dir)
    except TierrouteError as exc:
        raise BenchError(str(exc)) from None
    from router.config import LlamaCppSettings

    defaults = LlamaCppSettings(model="-")
    return Pair(
        tier=str(plain["name"]),
        model=model,
        draft_model=draft_model,
        draft_max=int(draft["llamacpp"].get("draft_max", DEFAULT_DRAFT_MAX)),
        n_threads=n_threads,
        n_ctx=int(engine.get("n_ctx", defaults.n_ctx)),
        n_parallel=int(engine.get("n_parallel", defaults.n_parallel)),
    )


def draft_support(draft_config: Path) -> str | None:
    """None when this engine accepts the draft config; otherwise why not, in words. An engine
    without speculative decoding refuses `draft_model` as an unknown key."""
    from router.config import load_settings
    from router.errors import ConfigError

    try:
        load_settings(draft_config)
    except ConfigError as exc:
        if any(key in str(exc) for key in DRAFT_KEYS):
            return (
                "this tierroute's engine does not support speculative decoding yet "
                f"(its config refuses the draft keys): {exc}"
            )
        raise BenchError(str(exc)) from None
    return None


def tierroute_command(config: Path, port: int) -> str:
    return shlex.join([sys.executable, "-m", "router.cli", "--config", str(config), "serve", "--port", str(port)])


def llama_server_command(binary: Path, pair: Pair, port: int, *, draft: bool) -> str:
    """llama-server on the pair with tierroute's engine settings: the same threads for prompt and
    decode (and for the draft model), one KV cache shared by all slots as ours is, the same slots,
    the same draft length, every draft position tried (no minimum, no confidence cut-off), and
    its Prometheus counters on for the acceptance rate."""
    args = [
        str(binary),
        "--model",
        str(pair.model),
        "--threads",
        str(pair.n_threads),
        "--threads-batch",
        str(pair.n_threads),
        "--ctx-size",
        str(pair.n_ctx),
        "--parallel",
        str(pair.n_parallel),
        "--kv-unified",
        "--metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if draft:
        args += [
            "--model-draft",
            str(pair.draft_model),
            # without it this llama-server loads the draft model and never drafts with it
            "--spec-type",
            "draft-simple",
            "--spec-draft-threads",
            str(pair.n_threads),
            "--spec-draft-threads-batch",
            str(pair.n_threads),
            "--spec-draft-n-max",
            str(pair.draft_max),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            "0",
        ]
    return shlex.join(args)


def plan_variants(
    wanted: Sequence[str],
    *,
    plain_config: Path,
    draft_config: Path,
    pair: Pair,
    llama_server: Path | None,
    port: Callable[[], int] = free_port,
) -> list[Variant]:
    """The variants asked for, in the order given, each a launched server on its own port or a
    skip with its reason."""
    out: list[Variant] = []
    unsupported = draft_support(draft_config) if "tierroute+draft" in wanted else None
    for label in wanted:
        if label not in VARIANTS:
            raise BenchError(f"unknown variant {label!r}; variants: {', '.join(VARIANTS)}")
        p = port()
        url = f"http://127.0.0.1:{p}/v1"
        if label == "tierroute":
            out.append(Variant(label, Target(url, label, model=pair.tier, launch=tierroute_command(plain_config, p))))
        elif label == "tierroute+draft":
            if unsupported is not None:
                out.append(Variant(label, None, unsupported))
                continue
            out.append(Variant(label, Target(url, label, model=pair.tier, launch=tierroute_command(draft_config, p))))
        else:
            if llama_server is None or not llama_server.is_file():
                where = "no --llama-server given" if llama_server is None else f"{llama_server} does not exist"
                out.append(Variant(label, None, f"{where}; build it with scripts/build_llama_server.sh"))
                continue
            command = llama_server_command(llama_server, pair, p, draft=label == "llama-server+draft")
            out.append(Variant(label, Target(url, label, launch=command)))
    return out


def drafting_missing(result: dict[str, Any]) -> bool:
    """A drafting variant whose server counted no draft tokens at some level: its figures are
    plain decoding's, and the comparison would say nothing about speculative decoding."""
    if not str(result.get("label", "")).endswith("+draft"):
        return False
    return any(((lv.get("drafts") or {}).get("total") or {}).get("drafted", 0) == 0 for lv in result.get("levels", []))


def spec_comparison(targets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level, tierroute drafting against its own plain decoding and against llama-server
    drafting (the issue's two bars), and plain tierroute against plain llama-server when both ran:
    output tok/s ratios (above 1: tierroute+draft is faster) and p50 latency ratios (below 1: it
    answers sooner)."""
    by_label = {t["label"]: t for t in targets if "levels" in t}
    pairs = [
        ("tierroute+draft", "tierroute"),
        ("tierroute+draft", "llama-server+draft"),
        ("tierroute", "llama-server"),
    ]
    rows: list[dict[str, Any]] = []
    for of, to in pairs:
        a, b = by_label.get(of), by_label.get(to)
        if a is None or b is None:
            continue
        for level in a["levels"]:
            other = next((lv for lv in b["levels"] if lv.get("concurrency") == level.get("concurrency")), None)
            if other is None:
                continue
            rows.append(
                {
                    "concurrency": level["concurrency"],
                    "of": of,
                    "to": to,
                    "output_tok_s_ratio": _ratio(level["output_tok_s"], other["output_tok_s"]),
                    "latency_p50_ratio": _ratio(level["latency_ms"]["p50"], other["latency_ms"]["p50"]),
                }
            )
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)
