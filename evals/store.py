"""Per-item results of an eval run, on disk, as the cache every later step reads.

A run is a directory::

    <runs>/<run>/manifest.json      what the run is: suite, items, tiers (with prices), verifiers
                 generations.jsonl  one line per (tier, item): text, tokens, latency, logprobs,
                                    and each token's top-k alternatives where the suite asks
                 scores.jsonl       one line per (tier, item, verifier): score, reason, cost
                 grades.jsonl       one line per (tier, item): correct or not, extracted answer

Every record carries a content key: a generation's is a hash of the tier's model and generation
parameters and of the prompt; a score's adds the verifier and its params; a grade's adds the
suite's grader version. A rerun looks each key up and computes only what is missing, so a new
tier, a new verifier or a larger `--limit` costs only the new work.

Records are appended one line at a time, flushed and fsynced as each finishes: Ctrl-C or a crash
loses at most the items in flight. A torn last line (a crash mid-write) is skipped on load.
Text only, no pickles: a run can be committed and read anywhere without models.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from router.generation import Generation, TokenLogprob

FORMAT = 1
_LOGPROB_DIGITS = 4  # enough for every confidence statistic; keeps committed runs small


def digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def generation_key(tier_fingerprint: str, prompt_sha: str) -> str:
    return digest("gen", tier_fingerprint, prompt_sha)


def score_key(gen_key: str, verifier_fingerprint: str) -> str:
    return digest("score", gen_key, verifier_fingerprint)


def grade_key(gen_key: str, suite_fingerprint: str, item_id: str) -> str:
    return digest("grade", gen_key, suite_fingerprint, item_id)


@dataclass(frozen=True)
class GenerationRecord:
    key: str
    tier: str
    item: str
    model: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    busy_s: float | None = None
    ttft_s: float | None = None
    logprobs: list[float] | None = None
    error: str | None = None  # the request could not be served (too long, say); graded wrong
    # per token [piece, logprob, [[piece, logprob], ...]]; absent from records written before it
    top_logprobs: list[list[Any]] | None = None
    # [source, drafted, accepted] per draft source, when the tier drafted (speculative decoding)
    drafts: list[list[Any]] | None = None

    @classmethod
    def from_generation(cls, key: str, tier: str, item: str, gen: Generation) -> GenerationRecord:
        lps = None if gen.token_logprobs is None else [round(x, _LOGPROB_DIGITS) for x in gen.token_logprobs]
        return cls(
            key=key,
            tier=tier,
            item=item,
            model=gen.model,
            text=gen.text,
            finish_reason=gen.finish_reason,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            latency_s=round(gen.latency_s, 4),
            busy_s=None if gen.busy_s is None else round(gen.busy_s, 4),
            ttft_s=None if gen.ttft_s is None else round(gen.ttft_s, 4),
            logprobs=lps,
            top_logprobs=None if gen.top_logprobs is None else [_top_row(t) for t in gen.top_logprobs],
            drafts=[list(d) for d in gen.drafts] or None,
        )

    def to_generation(self) -> Generation:
        """The generation as verifiers see it: rebuilt from the record, so a score computed now and
        one computed from the cache later read exactly the same values."""
        return Generation(
            text=self.text,
            finish_reason=self.finish_reason,  # type: ignore[arg-type]
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            token_logprobs=None if self.logprobs is None else tuple(self.logprobs),
            latency_s=self.latency_s,
            ttft_s=self.ttft_s,
            busy_s=self.busy_s,
            model=self.model,
            top_logprobs=None if self.top_logprobs is None else tuple(_top_entry(row) for row in self.top_logprobs),
        )


def _top_row(t: TokenLogprob) -> list[Any]:
    return [t.token, round(t.logprob, _LOGPROB_DIGITS), [[p, round(lp, _LOGPROB_DIGITS)] for p, lp in t.top]]


def _top_entry(row: list[Any]) -> TokenLogprob:
    token, logprob, top = row
    return TokenLogprob(str(token), float(logprob), tuple((str(p), float(lp)) for p, lp in top))


@dataclass(frozen=True)
class ScoreRecord:
    key: str
    gen: str
    tier: str
    item: str
    verifier: str  # the verifier's label, e.g. "confidence" or "confidence[stat=min]"
    value: float | None  # None: the verifier abstained on this answer
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    cost_prompt_tokens: int = 0
    cost_completion_tokens: int = 0
    cost_seconds: float = 0.0
    cost_tier: str | None = None  # the tier whose backend did the verifier's extra work
    verify_s: float = 0.0
    error: str | None = None  # the verifier failed on this answer; scored 0 (escalate)


@dataclass(frozen=True)
class GradeRecord:
    key: str
    gen: str
    tier: str
    item: str
    correct: bool
    extracted: str | None = None
    detail: str = ""


R = TypeVar("R", GenerationRecord, ScoreRecord, GradeRecord)


def _clip(value: Any, limit: int = 300) -> Any:
    """Keep stored details small: long strings cut, nested containers clipped."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "…"
    if isinstance(value, dict):
        return {str(k): _clip(v, limit) for k, v in list(value.items())[:20]}
    if isinstance(value, list | tuple):
        return [_clip(v, limit) for v in list(value)[:20]]
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, int | bool) or value is None:
        return value
    return _clip(str(value), limit)


class _Log:
    """One append-only JSONL file of records, indexed by key in memory (last record wins)."""

    def __init__(self, path: Path, kind: type[R]) -> None:
        self.path = path
        self.kind: type[Any] = kind
        self.records: dict[str, Any] = {}
        self.skipped = 0
        names = {f.name for f in fields(kind)}
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        raw = json.loads(line)
                        rec = kind(**{k: v for k, v in raw.items() if k in names})
                    except (json.JSONDecodeError, TypeError):
                        self.skipped += 1  # a torn line from a crash mid-write
                        continue
                    self.records[rec.key] = rec
        self._fh: Any = None

    def append(self, rec: Any) -> None:
        self.append_all([rec])

    def append_all(self, recs: Sequence[Any]) -> None:
        """Append records with one flush and fsync: a bulk writer (an import of published answers)
        pays the sync once, not once per record."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = self.path.is_file() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
            self._fh = open(self.path, "a", encoding="utf-8")
            if torn:
                self._fh.write("\n")  # never glue a new record onto a torn one
        for rec in recs:
            self._fh.write(json.dumps(asdict(rec), ensure_ascii=False, separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        for rec in recs:
            self.records[rec.key] = rec

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _clipped_grade(rec: GradeRecord) -> GradeRecord:
    clipped = None if rec.extracted is None else _clip(rec.extracted, 200)
    return GradeRecord(**{**asdict(rec), "extracted": clipped, "detail": _clip(rec.detail, 300)})


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class RunStore:
    """A run directory: its manifest and its three record logs."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.generations = _Log(self.root / "generations.jsonl", GenerationRecord)
        self.scores = _Log(self.root / "scores.jsonl", ScoreRecord)
        self.grades = _Log(self.root / "grades.jsonl", GradeRecord)

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def graded(self) -> Iterator[tuple[str, dict[str, Any], GenerationRecord, GradeRecord]]:
        """(tier name, manifest item entry, generation, grade) for each of the run's own items and
        tiers that has both, graded by the suite's current grader: a regraded run keeps the older
        grades in its log too, and only the manifest's suite fingerprint names the current ones."""
        manifest = self.manifest()
        suite_fp = manifest["suite"]["fingerprint"]
        for tier in manifest["tiers"]:
            for entry in manifest["items"]:
                gk = generation_key(tier["fingerprint"], entry["prompt_sha"])
                rec = self.generations.records.get(gk)
                grade = self.grades.records.get(grade_key(gk, suite_fp, entry["id"]))
                if rec is not None and grade is not None:
                    yield tier["name"], entry, rec, grade

    def manifest(self) -> dict[str, Any]:
        from router.errors import ConfigError

        if not self.manifest_path.is_file():
            raise ConfigError(f"no eval run at {self.root} (no manifest.json)")
        data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ConfigError(f"{self.manifest_path}: unknown format {data.get('format')!r}")
        manifest: dict[str, Any] = data
        return manifest

    def write_manifest(self, data: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, **{k: v for k, v in data.items() if k != "format"}}
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".manifest-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.manifest_path)

    def add_generation(self, rec: GenerationRecord) -> None:
        self.generations.append(rec)

    def add_score(self, rec: ScoreRecord) -> None:
        self.scores.append(rec.__class__(**{**asdict(rec), "details": _clip(rec.details)}))

    def add_grade(self, rec: GradeRecord) -> None:
        self.add_grades([rec])

    def add_generations(self, recs: Sequence[GenerationRecord]) -> None:
        self.generations.append_all(recs)

    def add_grades(self, recs: Sequence[GradeRecord]) -> None:
        self.grades.append_all([_clipped_grade(rec) for rec in recs])

    def close(self) -> None:
        for log in (self.generations, self.scores, self.grades):
            log.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
