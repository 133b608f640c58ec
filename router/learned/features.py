"""The features of the learned estimators, in one place: training and serving both call `vector`,
so what a model was fit on and what it is asked about at serve time cannot drift apart.

Two kinds of estimator read them:

- the `learned` verifier (``answer=True``): prompt features, the answer's logprob statistics,
  length and finish reason, and the scores of the built-in verifiers named in the spec;
- the pre-router (``answer=False``): the prompt alone, since it decides before generation.

Prompt features read the request as a caller sends it: its last user message (what is being
asked now; few-shot exchanges before it are the same for every item of a suite) and the number
of messages. Word uni- and bi-grams are hashed into ``n_buckets`` columns with BLAKE2b under a
fixed personalisation string, so a gram lands in the same column in every process and on every
machine (Python's ``hash()`` is salted per process and would not). The counts are log-scaled and
L2-normalised, so a long prompt weighs as much as a short one.

Token entropy would be a better confidence signal than the sampled token's logprob, but the
backends return only the sampled tokens' logprobs, so it is not a feature.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router.generation import Generation, GenerationRequest

_WORD = re.compile(r"\w+", re.UNICODE)
_HASH_PERSON = b"tierroute-ngram"  # blake2b personalisation: at most 16 bytes
_MAX_PROMPT_CHARS = 20_000  # bounds the serve-time cost of hashing a very long prompt
_LOGPROB_FLOOR = -30.0  # a -inf or -1000 logprob would dominate the standardised statistics
_LOG_HALF = math.log(0.5)

PROMPT_FEATURES = ("prompt_chars_log", "prompt_words_log", "prompt_lines_log", "prompt_messages", "prompt_digit_frac")
ANSWER_FEATURES = (
    "lp_mean",
    "lp_min",
    "lp_p10",
    "lp_p25",
    "lp_std",
    "lp_frac_below_half",
    "has_logprobs",
    "completion_tokens_log",
    "answer_chars_log",
    "finish_length",
    "prompt_tokens_log",
)

ABSTAINED = 0.5  # the feature value of a verifier that abstained on an answer


@dataclass(frozen=True)
class VerifierRef:
    """A built-in (or plugin) verifier whose score is a feature: its label in eval results, and
    the name and params that build it at serve time."""

    label: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "params": dict(self.params)}


@dataclass(frozen=True)
class FeatureSpec:
    answer: bool  # the verifier's features (True) or the pre-router's, prompt only (False)
    verifiers: tuple[VerifierRef, ...] = ()
    n_buckets: int = 1024
    ngram_max: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.n_buckets <= 1 << 20:
            raise ValueError("n_buckets must be between 1 and 2^20")
        if self.ngram_max not in (1, 2, 3):
            raise ValueError("ngram_max must be 1, 2 or 3")
        if self.verifiers and not self.answer:
            raise ValueError("a prompt-only spec cannot read verifier scores")

    @property
    def dense_names(self) -> list[str]:
        """The columns that are standardised: everything but the hashed grams."""
        names = list(PROMPT_FEATURES)
        if self.answer:
            names += ANSWER_FEATURES
            names += [f"score:{v.label}" for v in self.verifiers]
        return names

    @property
    def names(self) -> list[str]:
        return self.dense_names + [f"ngram:{i}" for i in range(self.n_buckets)]

    def to_json(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "verifiers": [v.to_json() for v in self.verifiers],
            "n_buckets": self.n_buckets,
            "ngram_max": self.ngram_max,
            "hash": "blake2b-64/" + _HASH_PERSON.decode(),
            "tokens": _WORD.pattern + " over the lowercased last user message",
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureSpec:
        if data.get("hash") != "blake2b-64/" + _HASH_PERSON.decode():
            raise ValueError(f"unknown gram hash {data.get('hash')!r}")
        refs = []
        for v in data.get("verifiers", []):
            if not isinstance(v, Mapping) or not isinstance(v.get("label"), str) or not isinstance(v.get("name"), str):
                raise ValueError("each feature verifier needs a label and a name")
            params = v.get("params", {})
            if not isinstance(params, Mapping):
                raise ValueError(f"feature verifier {v['label']}: params must be an object")
            refs.append(VerifierRef(v["label"], v["name"], dict(params)))
        if not isinstance(data.get("answer"), bool):
            raise ValueError("spec.answer must be true or false")
        n, k = data.get("n_buckets"), data.get("ngram_max")
        if not isinstance(n, int) or not isinstance(k, int) or isinstance(n, bool) or isinstance(k, bool):
            raise ValueError("spec.n_buckets and spec.ngram_max must be integers")
        return cls(answer=data["answer"], verifiers=tuple(refs), n_buckets=n, ngram_max=k)

    def vector(
        self,
        request: GenerationRequest,
        generation: Generation | None = None,
        scores: Mapping[str, float | None] | None = None,
    ) -> np.ndarray:
        """One row of features. The verifier's spec needs the generation and a score for each
        of its verifiers (by label); the pre-router's reads the request only. A verifier that
        abstained (None) reads as 0.5: no evidence either way."""
        text = _prompt_text(request)
        row = prompt_features(request, text)
        if self.answer:
            if generation is None:
                raise ValueError("the learned verifier's features need the generation")
            row += answer_features(generation)
            scores = scores or {}
            missing = [v.label for v in self.verifiers if v.label not in scores]
            if missing:
                raise ValueError(f"missing verifier scores: {', '.join(missing)}")
            row += [ABSTAINED if (v := scores[ref.label]) is None else float(v) for ref in self.verifiers]
        out = np.zeros(len(row) + self.n_buckets)
        out[: len(row)] = row
        out[len(row) :] = hashed_grams(text, self.n_buckets, self.ngram_max)
        return out


def _prompt_text(request: GenerationRequest) -> str:
    return request.last_user_text()[:_MAX_PROMPT_CHARS]


def prompt_features(request: GenerationRequest, text: str) -> list[float]:
    """`text` is the request's prompt text as `_prompt_text` cuts it."""
    digits = sum(c.isdigit() for c in text)
    return [
        math.log1p(len(text)),
        math.log1p(len(_WORD.findall(text))),
        math.log1p(text.count("\n") + 1 if text else 0),
        float(len(request.messages) if request.messages is not None else 1),
        digits / len(text) if text else 0.0,
    ]


def logprob_stats(logprobs: Sequence[float] | None) -> list[float]:
    """mean, min, 10th and 25th percentile, standard deviation, the fraction of tokens the model
    gave less than even odds, and whether there were any (all 0 when there are none)."""
    lps = [max(_LOGPROB_FLOOR, min(0.0, lp)) for lp in (logprobs or ()) if not math.isnan(lp)]
    if not lps:
        return [0.0] * 7
    arr = np.asarray(lps)
    return [
        float(arr.mean()),
        float(arr.min()),
        float(np.percentile(arr, 10)),
        float(np.percentile(arr, 25)),
        float(arr.std()),
        float((arr < _LOG_HALF).mean()),
        1.0,
    ]


def answer_features(generation: Generation) -> list[float]:
    return [
        *logprob_stats(generation.token_logprobs),
        math.log1p(max(0, generation.completion_tokens)),
        math.log1p(len(generation.text)),
        1.0 if generation.finish_reason == "length" else 0.0,
        math.log1p(max(0, generation.prompt_tokens)),
    ]


def gram_bucket(gram: str, n_buckets: int) -> int:
    h = hashlib.blake2b(gram.encode("utf-8"), digest_size=8, person=_HASH_PERSON).digest()
    return int.from_bytes(h, "little") % n_buckets


@functools.lru_cache(maxsize=64)
def hashed_grams(text: str, n_buckets: int, ngram_max: int = 2) -> np.ndarray:
    """log(1 + count) of each word n-gram (1..ngram_max) per bucket, L2-normalised. Read-only and
    cached: a request's pre-router and learned verifier hash the same prompt once."""
    words = _WORD.findall(text.lower())
    out = np.zeros(n_buckets)
    for n in range(1, ngram_max + 1):
        for i in range(len(words) - n + 1):
            out[gram_bucket(" ".join(words[i : i + n]), n_buckets)] += 1.0
    out = np.log1p(out)
    norm = float(np.linalg.norm(out))
    if norm > 0:
        out = out / norm
    out.flags.writeable = False
    return out
