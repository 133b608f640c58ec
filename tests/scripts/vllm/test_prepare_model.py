"""scripts/vllm/prepare_model.py's checks, as an attacker who can write to ~/.cache would meet them
(no vLLM environment needed: the refusals come before anything is parsed or imported). A
checkpoint whose files differ from the committed list is refused, even when its own SHA256SUMS
was rewritten to match; a file planted beside the weights is refused; a stale checkpoint is
rebuilt only from a GGUF that matches its pin, and a GGUF that does not is refused before
transformers (its parser) is imported."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from scripts.vllm import prepare_model

FILES = {"config.json": b'{"architectures": ["Qwen2ForCausalLM"]}', "model.safetensors": b"\0" * 4096}


def _sums(files: dict[str, bytes]) -> str:
    return "".join(f"{hashlib.sha256(v).hexdigest()}  {k}\n" for k, v in sorted(files.items()))


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A prepared checkpoint, the committed list it matches, and a GGUF that is not the pinned one."""
    out = tmp_path / "models" / "m"
    out.mkdir(parents=True)
    for name, data in FILES.items():
        (out / name).write_bytes(data)
    (out / "SHA256SUMS").write_text(_sums(FILES))
    expect = tmp_path / "m.sha256"
    expect.write_text(_sums(FILES))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\xff" * 64)  # hostile: whatever it holds, it is not the pinned file
    return out, expect, gguf


def _run(monkeypatch: pytest.MonkeyPatch, out: Path, expect: Path, gguf: Path) -> int:
    pinned = "0" * 64
    argv = [
        "prepare_model.py",
        "--gguf",
        str(gguf),
        "--gguf-sha256",
        pinned,
        "--out",
        str(out),
        "--expect",
        str(expect),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    return prepare_model.main()


def test_the_checkpoint_as_committed_is_taken(monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path, Path]) -> None:
    assert _run(monkeypatch, *layout) == 0


def test_a_tampered_file_with_its_sums_rewritten_is_refused(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path, Path]
) -> None:
    out, _, _ = layout
    tampered = {**FILES, "model.safetensors": b"\1" + FILES["model.safetensors"][1:]}
    (out / "model.safetensors").write_bytes(tampered["model.safetensors"])
    (out / "SHA256SUMS").write_text(_sums(tampered))  # the folder agrees with itself, not with the repo
    with pytest.raises(SystemExit, match="differs from .*: refused"):
        _run(monkeypatch, *layout)


def test_a_planted_file_is_refused(monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path, Path]) -> None:
    out, _, _ = layout
    planted = {**FILES, "modeling_qwen2.py": b"import os; os.system('id')"}
    (out / "modeling_qwen2.py").write_bytes(planted["modeling_qwen2.py"])
    (out / "SHA256SUMS").write_text(_sums(planted))
    with pytest.raises(SystemExit, match="refused"):
        _run(monkeypatch, *layout)


def test_a_stale_checkpoint_is_rebuilt_only_from_the_pinned_gguf(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path, Path]
) -> None:
    out, _, gguf = layout
    (out / "model.safetensors").write_bytes(b"tampered, SHA256SUMS left as it was")
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    with pytest.raises(SystemExit, match=f"{gguf.name}: sha256 .*, not the pinned .*: refused"):
        _run(monkeypatch, *layout)
    assert "transformers" not in sys.modules  # refused before its GGUF reader was imported
    assert not (out.parent / "m.partial").exists()
    assert (out / "config.json").read_bytes() == FILES["config.json"]  # nothing replaced
