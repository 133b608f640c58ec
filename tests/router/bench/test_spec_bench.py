"""`tierroute bench spec` on SmolLM2 drafting for itself: the plain tier is launched and measured
for real, the drafted one is measured when the engine supports `draft_model` (and skipped with the
reason when it does not), and llama-server is skipped with the way to build it. Tiny loads: these
prove the harness, not the speed. The llama-server variants need the binary that
scripts/build_llama_server.sh builds, so they are not run here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router.bench.drafts import draft_delta, metrics_url, parse_draft_counters
from router.bench.spec import drafting_missing, llama_server_command, plan_variants, read_pair, spec_comparison
from router.bench.workload import BenchError, Target
from router.cli import main
from tests.support.config import write_config
from tests.support.model import SMOL

TIER = """
[[tiers]]
name = "large"
backend = "llamacpp"
max_tokens = 64
timeout_s = 120

[tiers.llamacpp]
model = "{model}"
n_ctx = 2048
n_threads = {threads}
n_parallel = 2
{draft}
[tiers.price]
usd_per_hour = 0.1
"""


def _config(path: Path, *, draft: str = "", threads: int = 1, model: str = SMOL) -> Path:
    body = f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{path.parent / "ledger.sqlite3"}"\n'
    return write_config(path, body + TIER.format(model=model, threads=threads, draft=draft))


@pytest.fixture
def pair_configs(tmp_path: Path, smol_path: Path) -> tuple[Path, Path]:
    plain = _config(tmp_path / "plain.toml")
    drafted = _config(tmp_path / "draft.toml", draft=f'draft_model = "{SMOL}"\ndraft_max = 4\n')
    return plain, drafted


def test_prometheus_draft_counters_of_both_servers() -> None:
    ours = (
        "# TYPE tierroute_draft_tokens counter\n"
        'tierroute_draft_tokens_total{tier="large",source="model"} 40.0\n'
        'tierroute_draft_tokens_total{tier="large",source="rejected"} 100.0\n'
        'tierroute_draft_tokens_total{tier="small",source="model"} 10.0\n'
        "# TYPE tierroute_draft_accepted_tokens counter\n"
        'tierroute_draft_accepted_tokens_total{tier="large",source="model"} 30.0\n'
        'tierroute_draft_accepted_tokens_total{tier="large",source="rejected"} 55.0\n'
        "# TYPE tierroute_requests counter\n"
        'tierroute_requests_total{tier="large"} 7.0\n'
    )
    counts = parse_draft_counters(ours)
    assert counts == {
        ("model", "drafted"): 50.0,  # summed over tiers
        ("rejected", "drafted"): 100.0,
        ("model", "accepted"): 30.0,
        ("rejected", "accepted"): 55.0,
    }
    later = {**counts, ("model", "drafted"): 70.0, ("model", "accepted"): 45.0}
    delta = draft_delta(counts, later)
    assert delta["model"] == {"drafted": 20, "accepted": 15, "acceptance": 0.75}
    assert delta["rejected"] == {"drafted": 0, "accepted": 0, "acceptance": None}  # nothing proposed
    assert delta["total"]["acceptance"] == 0.75

    theirs = (
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
        "llamacpp:spec_decode_num_draft_tokens_total 80\n"
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 60\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 900\n"
    )
    assert parse_draft_counters(theirs) == {("model", "drafted"): 80.0, ("model", "accepted"): 60.0}
    assert parse_draft_counters("# TYPE x counter\nx_total 3\n") is None  # not drafting is not zero
    assert metrics_url(Target("http://127.0.0.1:9/v1", "t")) == "http://127.0.0.1:9/metrics"


def test_the_pair_must_differ_only_in_the_draft_keys(tmp_path: Path, pair_configs: tuple[Path, Path]) -> None:
    plain, drafted = pair_configs
    pair = read_pair(plain, drafted)
    assert (pair.tier, pair.draft_max, pair.n_threads, pair.n_ctx, pair.n_parallel) == ("large", 4, 1, 2048, 2)
    assert pair.model == pair.draft_model and pair.model.name.startswith("smollm2")

    other = _config(tmp_path / "other.toml", draft=f'draft_model = "{SMOL}"\n', threads=2)
    with pytest.raises(BenchError, match="same tier but for its draft keys"):
        read_pair(plain, other)
    with pytest.raises(BenchError, match="names no draft_model"):
        read_pair(plain, plain)
    with pytest.raises(BenchError, match="must not set"):
        read_pair(drafted, drafted)
    zero = _config(tmp_path / "zero.toml", threads=0)
    zero_draft = _config(tmp_path / "zero-draft.toml", threads=0, draft=f'draft_model = "{SMOL}"\n')
    with pytest.raises(BenchError, match="n_threads explicitly"):
        read_pair(zero, zero_draft)


def test_llama_server_gets_the_same_pair_and_settings(pair_configs: tuple[Path, Path]) -> None:
    pair = read_pair(*pair_configs)
    command = llama_server_command(Path("/opt/llama-server"), pair, 8123, draft=True).split()
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert command[0] == "/opt/llama-server"
    assert flags["--model"] == flags["--model-draft"] == str(pair.model)
    assert flags["--threads"] == flags["--threads-batch"] == flags["--spec-draft-threads"] == "1"
    assert (flags["--ctx-size"], flags["--parallel"], flags["--spec-draft-n-max"]) == ("2048", "2", "4")
    assert "--metrics" in command and "--kv-unified" in command
    assert flags["--spec-type"] == "draft-simple"  # a draft model alone does not make it draft
    plain = llama_server_command(Path("/opt/llama-server"), pair, 8123, draft=False)
    assert "--model-draft" not in plain and "--spec-draft-n-max" not in plain


def test_variants_without_a_binary_are_skipped_with_the_way_to_build_it(
    tmp_path: Path, pair_configs: tuple[Path, Path]
) -> None:
    plain, drafted = pair_configs
    pair = read_pair(plain, drafted)
    variants = plan_variants(
        ["llama-server+draft", "tierroute"],
        plain_config=plain,
        draft_config=drafted,
        pair=pair,
        llama_server=tmp_path / "missing",
    )
    assert [v.label for v in variants] == ["llama-server+draft", "tierroute"]
    assert variants[0].target is None and "scripts/build_llama_server.sh" in (variants[0].skipped or "")
    ours = variants[1].target
    assert ours is not None and ours.model == "large" and ours.launch is not None and str(plain) in ours.launch
    with pytest.raises(BenchError, match="unknown variant"):
        plan_variants(["vllm"], plain_config=plain, draft_config=drafted, pair=pair, llama_server=None)


def test_a_drafting_variant_that_never_drafted_is_caught() -> None:
    def level(drafted: int | None) -> dict[str, object]:
        return {"drafts": None if drafted is None else {"total": {"drafted": drafted}}}

    assert drafting_missing({"label": "llama-server+draft", "levels": [level(40), level(0)]})
    assert drafting_missing({"label": "tierroute+draft", "levels": [level(None)]})  # no counters at all
    assert not drafting_missing({"label": "tierroute+draft", "levels": [level(40), level(12)]})
    assert not drafting_missing({"label": "tierroute", "levels": [level(None)]})  # plain: nothing expected


def test_comparison_sets_drafting_against_both_bars() -> None:
    def target(label: str, rates: list[float]) -> dict[str, object]:
        levels = [
            {"concurrency": c, "output_tok_s": r, "latency_ms": {"p50": 1000.0 / r}}
            for c, r in zip((1, 8), rates, strict=True)
        ]
        return {"label": label, "levels": levels}

    rows = spec_comparison(
        [
            target("tierroute", [20.0, 40.0]),
            target("tierroute+draft", [30.0, 40.0]),
            {"label": "llama-server+draft", "skipped": "no binary"},
        ]
    )
    assert [(r["concurrency"], r["of"], r["to"], r["output_tok_s_ratio"]) for r in rows] == [
        (1, "tierroute+draft", "tierroute", 1.5),
        (8, "tierroute+draft", "tierroute", 1.0),
    ]
    assert rows[0]["latency_p50_ratio"] == pytest.approx(0.667, abs=1e-3)


def test_bench_spec_end_to_end_on_smollm2(tmp_path: Path, pair_configs: tuple[Path, Path]) -> None:
    plain, drafted = pair_configs
    out = tmp_path / "spec.json"
    rc = main(
        [
            "--config",
            str(plain),
            "bench",
            "spec",
            "--draft-config",
            str(drafted),
            "--llama-server",
            str(tmp_path / "no-llama-server"),
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "8",
            "--warmup",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["tool"] == "tierroute bench spec" and report["pair"]["draft_max"] == 4
    by_label = {t["label"]: t for t in report["targets"]}
    assert list(by_label) == ["tierroute", "tierroute+draft", "llama-server+draft"]
    assert "build_llama_server.sh" in by_label["llama-server+draft"]["skipped"]
    measured = [by_label["tierroute"]]
    if "skipped" in by_label["tierroute+draft"]:
        assert "draft_model" in by_label["tierroute+draft"]["skipped"]  # an engine without drafting says so
    else:
        measured.append(by_label["tierroute+draft"])
    for target in measured:
        assert target["pid"] is not None and target["launch"]
        assert [lv["concurrency"] for lv in target["levels"]] == [1, 2]
        for level in target["levels"]:
            assert (level["requests"], level["ok"], level["errors"]) == (2, 2, {})
            assert 0 < level["output_tokens"] <= 2 * 8 and level["output_tok_s"] > 0
    for level in by_label["tierroute"]["levels"]:
        # plain decoding proposes no drafts: the counters are absent, or present and unmoved
        drafts = level["drafts"]
        assert drafts is None or drafts["total"]["drafted"] == 0
    if len(measured) == 2:
        for level in by_label["tierroute+draft"]["levels"]:
            model = level["drafts"]["model"]
            assert model["drafted"] > 0 and model["acceptance"] > 0.8  # the model drafting for itself agrees
        assert [r["to"] for r in report["comparison"]] == ["tierroute", "tierroute"]


def test_a_sigterm_to_the_bench_stops_the_server_it_launched(pair_configs: tuple[Path, Path]) -> None:
    plain, drafted = pair_configs
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "--config",
            str(plain),
            "bench",
            "spec",
            "--draft-config",
            str(drafted),
        ]
        + ["--variants", "tierroute", "--concurrency", "1", "--requests", "200", "--max-tokens", "32"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert bench.stderr is not None
        line = bench.stderr.readline()  # "[tierroute] URL (pid N)" once the server answers
        found = re.search(r"\(pid (\d+)\)", line)
        assert found, line
        server = int(found.group(1))
        os.kill(server, 0)  # running
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{server}").exists(), "the launched server outlived the bench"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
