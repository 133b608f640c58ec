"""Learned quality estimators: the model and file format shared by the `learned` verifier
(`verifiers.learned`) and the prompt-only pre-router (here, since it is not a verifier: the cascade
asks it, before a tier generates, whether to skip the tier).

Both are logistic regressions over the features of `router.learned.features`, recalibrated by
Platt scaling, trained by ``tierroute eval train`` on stored eval results (see `evals.train`),
one model per tier, and shipped as one plain JSON file per estimator:

    {"format": "tierroute-estimator", "format_version": 1, "kind": "verifier" | "prerouter",
     "spec": {...the feature spec...}, "feature_names": [...],
     "models": {"<tier>": {"mean": [...], "scale": [...], "coef": [...], "intercept": x,
                           "platt_a": a, "platt_b": b, ...}},
     "trained_on": {...}}

    P(right) = sigmoid(platt_a * (coef . ((x - mean) / scale) + intercept) + platt_b)

A model is only ever read from numbers: nothing is unpickled, and a file is read only when its
SHA-256 is the one the config names, so a changed or swapped file is refused at start-up. The
estimator's version, reported with every decision, is that hash's first 12 hex digits.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.generation import GenerationRequest

if TYPE_CHECKING:
    import numpy as np

    from router.learned.features import FeatureSpec

FORMAT = "tierroute-estimator"
FORMAT_VERSION = 1
KINDS = ("verifier", "prerouter")
_SHA256_HEX = frozenset("0123456789abcdef")


class EstimatorError(ValueError):
    """An estimator artifact cannot be used: missing, tampered with, or malformed."""


def sigmoid(t: np.ndarray) -> np.ndarray:
    import numpy as np

    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(t, -500, 500)))
    return out


@dataclass(frozen=True)
class LinearModel:
    mean: Sequence[float] | np.ndarray  # per column; the hashed grams have mean 0 and scale 1
    scale: Sequence[float] | np.ndarray
    coef: Sequence[float] | np.ndarray
    intercept: float
    platt_a: float
    platt_b: float
    info: Mapping[str, Any]  # how it was fit: C, rows, positives; for reports only
    # mean, scale and coef as arrays, made once: decision() runs per request in the service
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        import numpy as np

        arrays = tuple(np.asarray(v, dtype=float) for v in (self.mean, self.scale, self.coef))
        object.__setattr__(self, "_arrays", arrays)

    def decision(self, x: np.ndarray) -> np.ndarray:
        """The uncalibrated logit of each row of `x` (2-D) or of `x` (1-D)."""
        import numpy as np

        mean, scale, coef = self._arrays
        out: np.ndarray = (np.asarray(x, dtype=float) - mean) / scale @ coef + self.intercept
        return out

    def probability(self, x: np.ndarray) -> np.ndarray:
        return sigmoid(self.platt_a * self.decision(x) + self.platt_b)

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
            "coef": [float(v) for v in self.coef],
            "intercept": float(self.intercept),
            "platt_a": float(self.platt_a),
            "platt_b": float(self.platt_b),
            "info": dict(self.info),
        }


@dataclass(frozen=True)
class Estimator:
    kind: str
    spec: FeatureSpec
    models: Mapping[str, LinearModel]  # tier name -> model
    sha256: str

    @property
    def version(self) -> str:
        return f"{self.kind}@{self.sha256[:12]}"

    def model_for(self, tier: str) -> LinearModel:
        try:
            return self.models[tier]
        except KeyError:
            raise EstimatorError(
                f"the {self.kind} estimator has no model for tier '{tier}'; it was trained for "
                f"{', '.join(sorted(self.models))}"
            ) from None


def dump_estimator(
    kind: str, spec: FeatureSpec, models: Mapping[str, LinearModel], trained_on: Mapping[str, Any]
) -> bytes:
    """The artifact's bytes: canonical JSON (sorted keys, no timestamps), so training the same
    data twice gives the same file and the same hash."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "spec": spec.to_json(),
        "feature_names": spec.names,
        "models": {t: m.to_json() for t, m in sorted(models.items())},
        "trained_on": dict(trained_on),
    }
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def load_estimator(path: Path | str, sha256: str, kind: str) -> Estimator:
    """Read an artifact after checking its hash against `sha256` (as the config names it)."""
    from router.learned.features import FeatureSpec

    if not isinstance(sha256, str) or len(sha256) != 64 or not set(sha256.lower()) <= _SHA256_HEX:
        raise EstimatorError("sha256 must be the artifact's 64-hex-digit SHA-256 (printed by `tierroute eval train`)")
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EstimatorError(f"cannot read estimator {path}: {exc.strerror or exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256.lower():
        raise EstimatorError(
            f"estimator {path}: SHA-256 {actual} is not the configured {sha256.lower()}; the file was changed "
            "after training, or the config names another file. Refusing to load it."
        )
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except ValueError as exc:
        raise EstimatorError(f"estimator {path}: not JSON: {exc}") from None
    try:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        if doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {doc.get('format_version')!r}; this tierroute reads {FORMAT_VERSION}")
        if doc.get("kind") != kind:
            raise ValueError(f"a {doc.get('kind')!r} estimator where a {kind!r} one is configured")
        spec = FeatureSpec.from_json(doc["spec"])
        if spec.answer != (kind == "verifier"):
            raise ValueError("the feature spec does not match the estimator's kind")
        if doc.get("feature_names") != spec.names:
            raise ValueError("feature_names do not match the spec")
        width = len(spec.names)
        models = {str(t): _model(t, m, width) for t, m in dict(doc["models"]).items()}
        if not models:
            raise ValueError("no models")
        trained_on = doc.get("trained_on", {})
        if not isinstance(trained_on, dict):
            raise ValueError("trained_on must be an object")
    except (ValueError, TypeError, KeyError) as exc:
        raise EstimatorError(f"estimator {path}: {exc}") from None
    return Estimator(kind=kind, spec=spec, models=models, sha256=actual)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number an estimator may hold")


def _model(tier: str, m: Any, width: int) -> LinearModel:
    if not isinstance(m, dict):
        raise ValueError(f"model for tier {tier!r} is not an object")
    arrays = {}
    for key in ("mean", "scale", "coef"):
        values = m.get(key)
        if not isinstance(values, list) or len(values) != width or not all(_finite(v) for v in values):
            raise ValueError(f"model for tier {tier!r}: {key} must be {width} finite numbers")
        arrays[key] = tuple(float(v) for v in values)
    if any(s <= 0 for s in arrays["scale"]):
        raise ValueError(f"model for tier {tier!r}: scale must be positive")
    scalars = {}
    for key in ("intercept", "platt_a", "platt_b"):
        if not _finite(m.get(key)):
            raise ValueError(f"model for tier {tier!r}: {key} must be a finite number")
        scalars[key] = float(m[key])
    info = m.get("info", {})
    return LinearModel(
        mean=arrays["mean"],
        scale=arrays["scale"],
        coef=arrays["coef"],
        intercept=scalars["intercept"],
        platt_a=scalars["platt_a"],
        platt_b=scalars["platt_b"],
        info=info if isinstance(info, dict) else {},
    )


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# ---- the pre-router ------------------------------------------------------------------------------------


class PreRouter:
    """Before a tier generates: the probability, from the prompt alone, that it will answer
    right. The cascade skips the tier when it is below `threshold`."""

    def __init__(self, estimator: Estimator, tier: str, threshold: float) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise EstimatorError("the pre-router threshold must be in [0, 1]")
        self.estimator = estimator
        self.tier = tier
        self.model = estimator.model_for(tier)
        self.threshold = threshold

    @classmethod
    def load(cls, artifact: Path | str, sha256: str, tier: str, threshold: float) -> PreRouter:
        return cls(load_estimator(artifact, sha256, "prerouter"), tier, threshold)

    @property
    def version(self) -> str:
        return self.estimator.version

    def probability(self, request: GenerationRequest) -> float:
        p = float(self.model.probability(self.estimator.spec.vector(request)))
        return min(1.0, max(0.0, p))
