"""The test model: SmolLM2-135M, small enough for every test that needs a real one."""

from __future__ import annotations

SMOL = "smollm2-135m-instruct-q4_1"
