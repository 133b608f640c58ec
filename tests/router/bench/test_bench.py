"""`tierroute bench` on real servers: our service and llama-cpp-python's on SmolLM2, and the
overhead mode with instant backends. Tiny loads: these prove the figures are sound, not fast."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from router.api.app import create_app
from router.backends.instant import InstantBackend
from router.bench import Outcome, arrivals, percentile, summarize
from router.bench.instant_server import instant_settings
from router.cache.keys import policy_version
from router.cli import main
from router.config import Settings, load_settings
from router.generation import GenerationRequest, Message
from tests.support.config import smol_config
from tests.support.servers import UvicornThread, free_port
from verifiers.base import Registry


def test_percentile_by_hand() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([40, 10, 30, 20], 50) == 25  # order of input does not matter
    assert percentile([10, 20, 30, 40], 0) == 10
    assert percentile([10, 20, 30, 40], 100) == 40
    one_to_hundred = list(range(1, 101))
    assert percentile(one_to_hundred, 95) == pytest.approx(95.05)  # rank 94.05 of 0..99
    assert percentile(one_to_hundred, 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_percentile_matches_numpy() -> None:
    rng = random.Random(1)
    for n in (2, 3, 17, 100):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (50, 95, 99):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_poisson_arrivals_are_seeded_and_near_the_rate() -> None:
    a = arrivals(50.0, 2000, seed=3)
    assert a == arrivals(50.0, 2000, seed=3)
    assert a[0] == 0.0 and a == sorted(a)
    assert 2000 / a[-1] == pytest.approx(50.0, rel=0.1)
    assert arrivals(4.0, 3, kind="uniform") == [0.0, 0.25, 0.5]


def test_summary_counts_refusals_apart_and_times_only_answers() -> None:
    outcomes = [
        Outcome(0, 0.0, latency_s=1.0, ttft_s=0.2, output_tokens=10, usage_reported=True),
        Outcome(1, 0.0, latency_s=3.0, ttft_s=0.4, output_tokens=30, usage_reported=True),
        Outcome(2, 0.0, latency_s=0.01, error="503"),
        Outcome(3, 0.0, latency_s=0.02, error="500"),
    ]
    s = summarize(outcomes, wall_s=4.0)
    assert (s["ok"], s["refused_503"], s["errors"]) == (2, 1, {"500": 1})
    assert s["output_tok_s"] == 10.0 and s["tokens_source"] == "usage"
    assert s["latency_ms"]["p50"] == 2000.0 and s["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert s["decode_ms_per_token"]["n"] == 2


async def test_instant_backend_is_honest() -> None:
    backend = InstantBackend("small", "the answer is 42")
    ask = GenerationRequest(messages=(Message("user", "what is six times seven"),), max_tokens=16)
    gen = await backend.generate(ask)
    assert gen.text == "the answer is 42" and gen.finish_reason == "stop"
    assert (gen.prompt_tokens, gen.completion_tokens) == (5, 4)
    assert gen.token_logprobs == (0.0,) * 4 and gen.latency_s < 0.01
    cut = await backend.generate(ask.with_(max_tokens=2))
    assert cut.text == "the answer" and cut.finish_reason == "length" and cut.completion_tokens == 2


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("bench"), large="none")
    with UvicornThread(create_app(load_settings(cfg), registry=Registry())) as srv:
        yield srv


def test_sweep_against_our_service_and_llama_cpp_server(
    service: UvicornThread, smol_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep.json"
    port = free_port()
    llama = (
        f"{sys.executable} -m llama_cpp.server --model {smol_path} --host 127.0.0.1 --port {port} "
        "--n_ctx 2048 --n_threads 1 --verbose false --interrupt_requests false"
    )
    rc = main(
        [
            "bench",
            "sweep",
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "8",
            "--warmup",
            "1",
            "--url",
            f"{service.url}/v1",
            "--label",
            "tierroute",
            "--pid",
            str(os.getpid()),
            "--url",
            f"http://127.0.0.1:{port}/v1",
            "--label",
            "llama-cpp-python",
            "--launch",
            llama,
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["tool"] == "tierroute bench sweep" and report["command"]
    assert report["workload"]["max_tokens"] == 8 and report["workload"]["prompts"] == 16
    ours, theirs = report["targets"]
    assert ours["label"] == "tierroute" and theirs["label"] == "llama-cpp-python"
    assert theirs["pid"] is not None  # the launched server's, watched without --pid
    for target, source in ((ours, "usage"), (theirs, "chunks")):  # llama.cpp's server sends no usage
        assert [lv["concurrency"] for lv in target["levels"]] == [1, 2]
        for level in target["levels"]:
            assert (level["requests"], level["ok"], level["refused_503"], level["errors"]) == (2, 2, 0, {})
            assert level["tokens_source"] == source
            assert set(level["finish_reasons"]) <= {"stop", "length"}  # none cut short
            assert 0 < level["output_tokens"] <= 2 * 8
            assert level["output_tok_s"] > 0 and level["requests_s"] > 0
            for key in ("p50", "p95", "p99"):
                assert 0 < level["ttft_ms"][key] <= level["latency_ms"][key]
            for row in level["per_request"]:
                assert row["error"] is None and 0 < row["ttft_ms"] <= row["latency_ms"]
            assert level["memory"]["peak_rss_mib"] > 50
    ratios = report["comparison"]
    assert [(r["concurrency"], r["of"], r["to"]) for r in ratios] == [
        (1, "tierroute", "llama-cpp-python"),
        (2, "tierroute", "llama-cpp-python"),
    ]
    assert all(r["output_tok_s_ratio"] > 0 for r in ratios)


def test_burst_answers_or_refuses_and_watches_memory(service: UvicornThread, tmp_path: Path) -> None:
    out = tmp_path / "burst.json"
    rc = main(
        [
            "bench",
            "burst",
            "--url",
            f"{service.url}/v1",
            "--pid",
            str(os.getpid()),
            "--requests",
            "4",
            "--concurrency",
            "4",
            "--rounds",
            "2",
            "--settle",
            "0",
            "--max-tokens",
            "2",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    target = json.loads(out.read_text())["target"]
    assert target["verdict"]["alive_after"] and target["verdict"]["every_request_answered_or_503"]
    assert target["verdict"]["rss_growth_first_to_last_round_mib"] is not None
    for row in target["rounds"]:
        assert row["ok"] + row["refused_503"] == 4 and row["errors"] == {}
        assert row["rss_before_mib"] > 0 and row["rss_settled_mib"] > 0


@pytest.mark.slow
def test_overhead_with_instant_backends(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    cfg = smol_config(tmp_path, verifiers='[[tiers.verifiers]]\nname = "confidence"\n')
    rc = main(
        [
            "--config",
            str(cfg),
            "bench",
            "overhead",
            "--rate",
            "20",
            "--seconds",
            "1",
            "--warmup",
            "5",
            "--verifiers",
            "none",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["requests"] == report["ok"] == 20 and report["errors"] == {}
    assert report["tiers"] == {"small": 20}  # no verifiers: the first tier accepts
    assert report["verifiers"] == {"small": [], "large": []} and report["verifiers_mode"] == "none"
    client, server = report["client_ms"], report["server_ms"]
    assert server["n"] == client["n"] == 20
    for key in ("p50", "p99"):
        assert 0 < server[key] <= client[key]
    assert report["memory"]["peak_rss_mib"] > 0
    floor = report["floor"]  # the same schedule against /healthz: HTTP with no router work
    assert floor["requests"] == floor["ok"] == 20 and floor["client_ms"]["p50"] > 0


@pytest.mark.slow
def test_overhead_of_cache_hits_on_a_postgresql_ledger(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 29's benchmark on the ledger replicas share: `--ledger-url` serves the ledger, and so
    # the cache, from PostgreSQL; the warm-up stores each prompt's answer, every timed request hits
    import psycopg

    out = tmp_path / "overhead.json"
    config = str(Path(__file__).resolve().parents[3] / "bench" / "cache-overhead.toml")
    args = ["--config", config, "bench", "overhead", "--rate", "20", "--seconds", "1", "--no-floor"]
    assert main([*args, "--ledger-url", db, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ledger"] == "postgresql" and report["options"]["ledger_url"] == db
    assert report["requests"] == report["ok"] == 20 and report["cache"] == {"hit": 20}
    with psycopg.connect(db) as conn:
        entries = conn.execute("SELECT count(*) FROM cache_entries").fetchone()
        hits = conn.execute("SELECT count(*) FROM attempts WHERE decision = 'cached'").fetchone()
        policies = {row[0] for row in conn.execute("SELECT DISTINCT policy FROM cache_entries")}
    assert entries is not None and 0 < entries[0] <= 16  # one per prompt
    assert hits is not None and hits[0] >= 20  # every timed request (and the warm-up's repeats)
    # the instant backend's answers sit in the shared database, but under the bench's own policy
    # version: the service, on this config and this database, would never read them as hits
    assert len(policies) == 1 and policy_version(load_settings(config)) not in policies
    # a password in the URL is refused before anything starts, as the config refuses it
    assert main([*args, "--ledger-url", db.replace("postgres@", "postgres:hunter2@")]) != 0
    assert "password" in capsys.readouterr().err


def test_overhead_never_serves_the_configs_own_ledger_url(tmp_path: Path) -> None:
    # the attack review's finding: a production config's ledger.url was kept, so `bench overhead
    # --config prod.toml` wrote the instant backend's "OK." into the replicas' ledger and cache, and
    # under scope "global" the real service then served it as a hit
    prod = Settings.model_validate(
        {
            "ledger": {"url": "postgresql://prod@db.internal:5432/ledger"},
            "cache": {"enabled": True, "scope": "global", "namespace": "release-7"},
            "tiers": [
                {
                    "name": "big",
                    "backend": "openai",
                    "openai": {"model": "m", "base_url": "http://127.0.0.1:9/v1"},
                    "price": {"usd_per_1m_input_tokens": 1, "usd_per_1m_output_tokens": 1},
                }
            ],
        }
    )
    scratch = tmp_path / "scratch.sqlite3"
    served = instant_settings(prod, verifiers="config", ledger_path=scratch)
    assert served.ledger.url is None and served.ledger.path == scratch
    # and even on a database named with --ledger-url, no entry is keyed as the service's, nor as
    # another bench run's
    shared = instant_settings(prod, verifiers="config", ledger_path=scratch, ledger_url="postgresql://b@h:5432/x")
    assert shared.ledger.url == "postgresql://b@h:5432/x"
    versions = {policy_version(prod), policy_version(served), policy_version(shared)}
    assert len(versions) == 3
    assert served.cache.namespace.startswith("bench-") and prod.cache.namespace == "release-7"
