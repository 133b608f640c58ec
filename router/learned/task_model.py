"""The learned task classifier: what kind of answer a prompt asks for, when the rules cannot tell.

`router.tasks` labels most requests from their fields and shapes (a `response_format`, an option
list, a code stub); a prompt that shows none of these still has a task, and this model guesses
it from the words. It is a linear model (multinomial logistic regression) over hashed features of
the prompt text, so serving it needs only numpy and the committed JSON, never scikit-learn:
`scripts/train_task_classifier.py` fits it with scikit-learn and writes the coefficients.

Why hashed tokens and not a vocabulary: the feature function below is the whole contract between
training and serving (both call `features`), there is no vocabulary to keep in step, and an
unseen word costs nothing. Why these features: lowercase word unigrams and bigrams carry the ask
("write a function", "how many", "tell me"), the symbol tokens carry the shape (`(`, `=`, `$`,
`A.`, a code fence), and every digit reads as 0, so "17 apples" and "23 apples" teach the same
thing. Counts are log-scaled and the vector L2-normalised, so a long prompt does not swamp the
intercepts.

Bounded cost: only the first `HEAD_CHARS` and the last `TAIL_CHARS` characters of a prompt are
read (the ask is usually at the start, the options or the stub at the end), so a request of any
size costs a few hundred microseconds. The model file carries a `format` and `version`;
`TaskClassifier.load` refuses a file it does not understand with a `TaskModelError` naming what
is wrong, rather than serving a half-read model.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router.errors import ConfigError

FORMAT = "tierroute.task_model"
VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "task_model.json"

HEAD_CHARS = 2000
TAIL_CHARS = 600

# A token is an ASCII word (letters, digits, underscore: an identifier stays whole) or any other
# single non-space character (code and maths live in the symbols). Every digit is read as 0, so
# "17 apples" and "23 apples" are the same feature while a number's length still shows.
_TOKEN = re.compile(r"\w+|\S", re.ASCII)
_DIGITS = str.maketrans("123456789", "000000000")
# Token -> crc32, kept between calls: the same few thousand words recur in every prompt.
_HASHES: dict[str, int] = {}
_HASHES_MAX = 200_000
_BIGRAM_MIX = np.uint64(0x9E3779B1)


class TaskModelError(ConfigError):
    """The task model file is missing, malformed, or of a version this code does not read."""


def clip(text: str) -> str:
    """The part of a prompt the model reads: its head and its tail."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def tokens(text: str) -> list[str]:
    """Lowercase words and single symbols of the clipped text, digits read as 0."""
    return _TOKEN.findall(clip(text).lower().translate(_DIGITS))


def _hash(token: str) -> int:
    h = _HASHES.get(token)
    if h is None:
        if len(_HASHES) >= _HASHES_MAX:
            _HASHES.clear()
        h = _HASHES[token] = zlib.crc32(token.encode("utf-8", "surrogatepass"))
    return h


def features(text: str, n_features: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Hashed unigrams and bigrams: (bucket indices, values), sorted by index, L2-normalised.

    A unigram's hash is crc32 of the token (stable across processes and platforms, unlike
    Python's salted `hash` of a str); a bigram's mixes its two tokens' hashes, so it costs no
    string building. Counts are log-scaled before normalising."""
    uni = np.fromiter(map(_hash, tokens(text)), dtype=np.uint64)
    if uni.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    big = ((uni[:-1] * _BIGRAM_MIX) ^ (uni[1:] + np.uint64(1))) & np.uint64(0xFFFFFFFF)
    buckets = (np.concatenate([uni, big]) % np.uint64(n_features)).astype(np.int64)
    index, counts = np.unique(buckets, return_counts=True)
    values = np.log1p(counts.astype(np.float64))
    values /= math.sqrt(float(values @ values))
    return index, values


@dataclass(frozen=True)
class TaskClassifier:
    """A fitted model: `coef[c, j]` weighs bucket j for class c."""

    classes: tuple[str, ...]
    coef: npt.NDArray[np.float64]  # (n_classes, n_features)
    intercept: npt.NDArray[np.float64]  # (n_classes,)
    meta: dict[str, Any]

    @property
    def n_features(self) -> int:
        return int(self.coef.shape[1])

    def scores(self, text: str) -> npt.NDArray[np.float64]:
        """Class probabilities, in the order of `classes`."""
        index, values = features(text, self.n_features)
        logits = self.coef[:, index] @ values + self.intercept
        logits -= logits.max()
        p = np.exp(logits)
        result: npt.NDArray[np.float64] = p / p.sum()
        return result

    def predict(self, text: str) -> tuple[str, float]:
        """The likeliest task and its probability."""
        p = self.scores(text if isinstance(text, str) else str(text))
        best = int(np.argmax(p))
        return self.classes[best], float(p[best])

    def to_json(self) -> dict[str, Any]:
        """The file's content: plain JSON, coefficients rounded to 6 significant digits."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "n_features": self.n_features,
            "head_chars": HEAD_CHARS,
            "tail_chars": TAIL_CHARS,
            "classes": list(self.classes),
            "intercept": [_round(v) for v in self.intercept],
            "coef": [[_round(v) for v in row] for row in self.coef],
            "meta": self.meta,
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, doc: Any, source: str = "task model") -> TaskClassifier:
        def bad(why: str) -> TaskModelError:
            return TaskModelError(f"{source}: {why}")

        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise bad(f"not a task model file (expected format '{FORMAT}')")
        if doc.get("version") != VERSION:
            raise bad(
                f"version {doc.get('version')!r} is not supported (this code reads version {VERSION}); retrain it"
            )
        if doc.get("head_chars") != HEAD_CHARS or doc.get("tail_chars") != TAIL_CHARS:
            raise bad("fitted on a different text window than this code reads; retrain it")
        classes, n, intercept, rows = doc.get("classes"), doc.get("n_features"), doc.get("intercept"), doc.get("coef")
        if not (isinstance(classes, list) and len(classes) >= 2 and all(isinstance(c, str) for c in classes)):
            raise bad("'classes' must be a list of at least two names")
        if len(set(classes)) != len(classes):
            raise bad("'classes' has duplicates")
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 20):
            raise bad("'n_features' must be a positive integer")
        if not (isinstance(intercept, list) and len(intercept) == len(classes)):
            raise bad("'intercept' must have one number per class")
        if not (isinstance(rows, list) and len(rows) == len(classes)):
            raise bad("'coef' must have one row per class")
        if not all(isinstance(row, list) and len(row) == n for row in rows):
            raise bad(f"each row of 'coef' must have n_features ({n}) numbers")
        # json gives int or float for a number; numpy would also take "1.5" or true, which no fitted file holds.
        if not all(type(v) in (int, float) for row in [intercept, *rows] for v in row):
            raise bad("coefficients must be numbers")
        coef = np.array(rows, dtype=np.float64)
        b = np.array(intercept, dtype=np.float64)
        if not (np.isfinite(coef).all() and np.isfinite(b).all()):
            raise bad("coefficients must be finite numbers")
        meta = doc.get("meta")
        return cls(tuple(classes), coef, b, meta if isinstance(meta, dict) else {})

    @classmethod
    def load(cls, path: Path | str | None = None) -> TaskClassifier:
        """The model at `path`, or the one committed with the package."""
        p = Path(path) if path is not None else DEFAULT_PATH
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise TaskModelError(f"cannot read task model {p}: {e.strerror or e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TaskModelError(f"task model {p} is not valid JSON: {e}") from None
        return cls.from_json(doc, source=f"task model {p}")


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def fit(
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    n_features: int = 1 << 13,
    c: float = 10.0,
    meta: dict[str, Any] | None = None,
) -> TaskClassifier:
    """Fit a model with scikit-learn (imported here: serving never needs it). Training reads text
    through exactly the `features` function serving does. Deterministic: the lbfgs solver has no
    randomness, and the inputs are taken in the order given."""
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression

    if len(texts) != len(labels) or not texts:
        raise ValueError("fit needs as many labels as texts, and at least one")
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, text in enumerate(texts):
        index, values = features(text, n_features)
        rows += [i] * len(index)
        cols += index.tolist()
        vals += values.tolist()
    x = csr_matrix((vals, (rows, cols)), shape=(len(texts), n_features))
    model = LogisticRegression(C=c, max_iter=2000, solver="lbfgs", class_weight="balanced")
    model.fit(x, list(labels))
    classes = tuple(str(k) for k in model.classes_)
    coef = np.asarray(model.coef_, dtype=np.float64)
    intercept = np.asarray(model.intercept_, dtype=np.float64)
    if len(classes) == 2:  # scikit-learn keeps one row for two classes; softmax over (-w/2, w/2) is the same model
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    # Rounded as the file stores them, so a freshly fitted model and its reloaded copy agree exactly.
    coef = np.array([[_round(v) for v in row] for row in coef])
    intercept = np.array([_round(v) for v in intercept])
    return TaskClassifier(classes, coef, intercept, dict(meta or {}, n_train=len(texts), c=c))
