"""`tierroute bench sweep --response-format FILE`: every request carries the schema, and the
report records it, so constrained and free decoding are compared on the same prompts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.api.app import create_app
from router.cli import main
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread
from verifiers.base import Registry

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("bench-structured"), large="none")
    with UvicornThread(create_app(load_settings(cfg), registry=Registry())) as srv:
        yield srv


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_sweep_sends_and_records_the_schema(service: UvicornThread, tmp_path: Path, api: str) -> None:
    schema_file, out = tmp_path / "schema.json", tmp_path / "sweep.json"
    schema_file.write_text(json.dumps(SCHEMA))
    rc = main(
        ["bench", "sweep", f"--{api}", "--concurrency", "2", "--requests", "2", "--max-tokens", "40", "--warmup", "0"]
        + ["--response-format", str(schema_file), "--url", f"{service.url}/v1", "--json", str(out)]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    wanted = {"type": "json_schema", "json_schema": {"name": "bench", "schema": SCHEMA}}
    assert report["workload"]["response_format"] == wanted
    (level,) = report["targets"][0]["levels"]
    assert (level["requests"], level["ok"], level["errors"]) == (2, 2, {})
    assert level["output_tok_s"] > 0


def test_a_bad_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    rc = main(["bench", "sweep", "--response-format", str(bad), "--url", "http://127.0.0.1:9/v1"])
    assert rc != 0
