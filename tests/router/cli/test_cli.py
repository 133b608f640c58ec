"""The command line as a user runs it: a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.config import smol_config

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_command() -> None:
    out = run("--help")
    assert out.returncode == 0
    for command in ("models", "config", "complete", "serve"):
        assert command in out.stdout
    models = run("models", "--help")
    for action in ("list", "pull", "path"):
        assert action in models.stdout


def test_complete_prints_answer_tier_tokens_latency(tmp_path: Path, smol_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    out = run("--config", str(cfg), "complete", "What is 17 * 3?", "--max-tokens", "16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "tier=small" in out.stderr
    assert "completion_tokens=" in out.stderr and "latency=" in out.stderr and "tokens/s=" in out.stderr


def test_complete_json(tmp_path: Path, smol_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    out = run("--config", str(cfg), "complete", "Say hi", "--max-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["tier"] == "small" and data["text"]
    assert data["attempts"][0]["completion_tokens"] <= 8


def test_config_check_reports_the_bad_key(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("n_parallel = 4", "n_parallel = 4\nn_paralel = 2"))
    out = run("--config", str(cfg), "config", "check")
    assert out.returncode == 1
    assert "tiers[0] (small).llamacpp.n_paralel" in out.stderr
    assert "Traceback" not in out.stderr


def test_config_check_ok(tmp_path: Path, smol_path: Path) -> None:
    out = run("config", "check", "--config", str(smol_config(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tiers"][0]["name"] == "small"


def test_models_path_of_unpulled_model_is_a_clear_error(tmp_path: Path) -> None:
    out = run("models", "path", "qwen2.5-coder-0.5b-instruct-q4_k_m", "--cache-dir", str(tmp_path))
    assert out.returncode == 1
    assert "not pulled yet" in out.stderr
