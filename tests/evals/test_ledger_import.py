"""Production labels into calibration, end to end: a real app on loopback serves requests (scripted
tiers), shadows every accepted answer into the ledger, and takes labels for half of them through
POST /v1/feedback with the official `openai` client; `eval import --ledger` grades by the labels
where they exist, `eval calibrate` chooses a threshold from them, and `report quality` shows the
labelled accuracy per tier with its interval.

The story the tiers tell, in four kinds of question (i % 4): the small tier's answer is boxed or
not, and opens with "The answer is" or not; two `format` verifiers score those (weights 1 and 2),
so its scores are 1, 2/3, 1/3 and 0 for kinds 0 to 3. The large tier answers the even kinds as the
small tier does and the odd kinds differently. A reviewer (an admin key) labels the odd kinds (half
the requests): kind 1 right, kind 3 wrong (a quarter of all answers). So three gradings choose
three thresholds for `min-accuracy=1`: shadow agreement alone reads both odd kinds as wrong and
escalates below 1; labels all "right" (the same ledger with every label turned right) escalate
nothing (0); the real labels escalate only kind 3, below 1/3: a threshold only the labels decide.

And the attack: one client key that asks the odd kinds itself and labels every answer right moved
that threshold from 1 to 0 for every tenant; by default only admin labels grade an import now, and
a client's are used only when the operator names its key or team (`--labels-from`)."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from evals.formatting import th
from evals.store import RunStore
from evals.sweep import SingleTier, evaluate, load_table
from router.api.app import create_app
from router.cli import main
from router.config import load_settings
from router.generation import GenerationRequest
from router.quality.live import wilson
from tests.support.accounting import keys_section
from tests.support.config import TOKEN_PRICE, Toml, tier, write_config
from tests.support.model import SMOL
from tests.support.scripted import ScriptedBackend
from tests.support.servers import UvicornThread

# 12 of each kind: the thresholds hinge on kinds 1 and 3 being in calibrate's half of the items
# (a split by the random request ids), which each misses with probability 2**-12
N = 48
KINDS = ("The answer is \\boxed{{{}}}.", "The answer is {}.", "It is \\boxed{{{}}}.", "It is {}.")


def number(request: GenerationRequest) -> int:
    found = re.search(r"What is (\d+) \+ 100", request.last_user_text())
    assert found
    return int(found.group(1))


def small(request: GenerationRequest) -> str:
    i = number(request)
    return KINDS[i % 4].format(i + 100)


def large(request: GenerationRequest) -> str:
    i = number(request)
    return f"The answer is \\boxed{{{i + 100 if i % 2 == 0 else i + 99}}}."


def config(tmp: Path, names: dict[str, dict[str, Any]] | None = None) -> tuple[Path, dict[str, str]]:
    keys, raw = keys_section(names or {"alice": {}, "bob": {}, "root": {"roles": ["admin"]}})
    engine = {"model": SMOL}  # never loaded: the tiers are scripted
    body = f'[server]\n{keys}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\nstore_prompts = true\n'
    body += tier(
        "small",
        threshold=0.0,  # accept every answer, so each is shadowed; the verifier's score is what calibration reads
        engine=engine,
        price={"usd_per_hour": Toml("3.6"), "stands_for": "test"},
        tables={"shadow": {"rate": 1.0, "usd_per_day": 1.0, "max_concurrency": 2, "max_queue": 64}},
        extra='[[tiers.verifiers]]\nname = "format"\nparams = { regex = "\\\\\\\\boxed\\\\{" }\n'
        '[[tiers.verifiers]]\nname = "format"\nweight = 2.0\nparams = { regex = "^The answer", name = "opening" }',
    )
    body += tier("large", engine=engine, price=TOKEN_PRICE)
    return write_config(tmp / "config.toml", body), raw


def shadow_pairs(ledger: Path) -> int:
    with contextlib.closing(sqlite3.connect(ledger)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM shadow_pairs").fetchone()[0])


def cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def ask_all(srv: UvicornThread, keys: dict[str, str], asker: dict[int, str], ledger: Path) -> dict[int, str]:
    """Item i asked by key `asker[i]` (each answered by the small tier and shadowed); the request ids."""
    ids: dict[int, str] = {}
    for i, name in asker.items():
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=keys[name], max_retries=0, timeout=30)
        r = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": f"What is {i} + 100?"}], max_tokens=16
        )
        assert r.model_extra is not None
        ext: dict[str, Any] = r.model_extra["tierroute"]
        assert ext["tier"] == "small"
        ids[i] = ext["request_id"]
    deadline = time.monotonic() + 60
    while shadow_pairs(ledger) < len(asker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shadow_pairs(ledger) == len(asker)
    return ids


def feedback(client: openai.OpenAI, **body: Any) -> dict[str, Any]:
    return client.post("/feedback", body=body, cast_to=httpx.Response).json()  # type: ignore[no-any-return]


def calibrated(cfg: Path, runs: Path, run: str, *extra: str) -> tuple[float, str]:
    out = cli("--config", str(cfg), "eval", "calibrate", "--run", str(runs / run), "--target", "min-accuracy=1", *extra)
    found = re.search(r"thresholds small=([0-9.]+)", out)
    assert found, out
    return float(found.group(1)), out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_labels_posted_for_half_the_requests_calibrate_the_threshold_and_show_in_the_report(tmp_path: Path) -> None:
    cfg, keys = config(tmp_path)
    ledger = tmp_path / "ledger.sqlite3"
    backends = {"small": ScriptedBackend("small", small), "large": ScriptedBackend("large", large)}
    with UvicornThread(create_app(load_settings(cfg), backends=backends)) as srv:
        ids = ask_all(srv, keys, dict.fromkeys(range(N), "alice"), ledger)
        alice, bob, root = (
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key=keys[name], max_retries=0, timeout=30)
            for name in ("alice", "bob", "root")
        )
        # a reviewer (an admin key) labels the odd kinds (half the requests): kind 1 right, kind 3
        # wrong; every other one of each after a first label the other way, which the latest corrects
        for i in range(1, N, 2):
            right = i % 4 == 1
            corrected = i % 8 in (1, 3)
            if corrected:
                feedback(root, request_id=ids[i], score=not right, label="first_look")
            got = feedback(root, request_id=ids[i], score=1.0 if right else False, label="tests")
            assert got["labels"] == (2 if corrected else 1)
        # another key's request and an unknown one: the same 404 through the official client; a bad score: 400
        with pytest.raises(openai.NotFoundError) as foreign:
            feedback(bob, request_id=ids[1], score=0)
        with pytest.raises(openai.NotFoundError) as unknown:
            feedback(bob, request_id="chatcmpl-" + "0" * 24, score=0)
        assert foreign.value.code == unknown.value.code == "request_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            feedback(alice, request_id=ids[1], score=2)
        assert bad.value.param == "score"

    # the same ledger graded three ways: its labels; shadow agreement alone (the labels taken out
    # of a copy); every label turned right (another copy), as the test's first version had them
    copies = {"proxy": "DELETE FROM feedback", "all_right": "UPDATE feedback SET score = 1.0"}
    for name, change in copies.items():
        shutil.copy(ledger, tmp_path / f"{name}.sqlite3")
        with contextlib.closing(sqlite3.connect(tmp_path / f"{name}.sqlite3")) as conn, conn:
            conn.execute(change)
    runs = tmp_path / "runs"
    base = ["--config", str(cfg), "eval"]
    half = N // 2
    out = cli(*base, "import", "--ledger", str(ledger), "--run", "labelled", "--runs-dir", str(runs))
    assert f"{half} by feedback" in out and f"{half} by shadow agreement" in out
    for name in copies:
        cli(*base, "import", "--ledger", str(tmp_path / f"{name}.sqlite3"), "--run", name, "--runs-dir", str(runs))
    labelled, proxy, all_right = (load_table(RunStore(runs / name)) for name in ("labelled", *copies))
    assert evaluate(SingleTier(0), labelled).accuracy == 0.75  # the labels: kind 3 wrong
    assert evaluate(SingleTier(0), proxy).accuracy == 0.5  # the proxy: both odd kinds wrong
    assert evaluate(SingleTier(0), all_right).accuracy == 1.0
    # the large tier: wrong where it disagreed with an answer labelled right (kind 1); beside one
    # labelled wrong that it disagreed with (kind 3) nothing says, and it is taken as right
    assert evaluate(SingleTier(1), labelled).accuracy == 0.75
    assert RunStore(runs / "labelled").manifest()["import"]["grading"] == {
        "feedback": half,
        "shadow_agreement": half,
    }

    assert RunStore(runs / "labelled").manifest()["import"]["labels"] == {
        "from": ["admin"],
        "used": {"root": half},
        "left_out": {},
        "roles": {"root": "admin"},
    }
    assert calibrated(cfg, runs, "proxy")[0] == 1.0  # escalate every answer scored below 1: kinds 1, 2, 3
    assert calibrated(cfg, runs, "all_right")[0] == 0.0  # escalate none
    chosen, said = calibrated(cfg, runs, "labelled", "--write")
    assert f"{half} by feedback (labels of root: {half})" in said
    assert th(chosen) == th(1 / 3)  # escalate kind 3 alone: what the labels, and only they, say
    written = load_settings(cfg).tiers[0].tasks["maths"].threshold
    assert written is not None and th(written) == th(chosen)

    # report quality: the labelled accuracy per tier, with its count and interval, beside agreement
    rows = list(csv.DictReader(io.StringIO(cli("report", "quality", "--csv", "--ledger", str(ledger)))))
    (row,) = [r for r in rows if r["tier"] == "small"]
    assert (row["task"], row["threshold"], row["pairs"], row["agreed"]) == ("maths", "0", str(N), str(half))
    right = N // 4  # kind 1
    assert (row["labelled"], row["labelled_right"]) == (str(half), str(right))
    assert float(row["label_accuracy"]) == pytest.approx(right / half)
    low, high = wilson(right, half)
    assert float(row["label_low"]) == pytest.approx(low, abs=1e-6)
    assert float(row["label_high"]) == pytest.approx(high, abs=1e-6)
    assert 0 < low < 0.5 < high < 1
    assert [r["tier"] for r in rows] == ["small"]  # the large tier answered shadows only: nobody's to label
    table = cli("report", "quality", "--ledger", str(ledger))
    assert f"{100 * low:.1f}%" in table and f"{100 * high:.1f}%" in table and f"{half + N // 8 * 2} labels" in table


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_client_keys_labels_do_not_recalibrate_the_threshold_for_every_tenant(tmp_path: Path) -> None:
    # alice, an honest tenant, asks the even kinds and labels nothing; mallory asks the odd kinds
    # (the answers the large tier disagrees with) and labels every one of them right. On main the
    # import read mallory's labels as ground truth, and calibrate moved the threshold from 1 to 0.
    cfg, keys = config(tmp_path, {"alice": {}, "mallory": {}})
    ledger = tmp_path / "ledger.sqlite3"
    backends = {"small": ScriptedBackend("small", small), "large": ScriptedBackend("large", large)}
    with UvicornThread(create_app(load_settings(cfg), backends=backends)) as srv:
        asker = {i: "alice" if i % 2 == 0 else "mallory" for i in range(N)}
        ids = ask_all(srv, keys, asker, ledger)
        mallory = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=keys["mallory"], max_retries=0, timeout=30)
        for i in range(1, N, 2):
            assert feedback(mallory, request_id=ids[i], score=True)["labels"] == 1
    runs = tmp_path / "runs"
    half = N // 2
    base = ["--config", str(cfg), "eval", "import", "--ledger", str(ledger), "--runs-dir", str(runs)]
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        said = cli(*base, "--run", "default")
    threshold, told = calibrated(cfg, runs, "default")
    assert threshold == 1.0  # what shadow agreement says: mallory's labels moved nothing
    assert f"labels left out: mallory ({half} items)" in told and "by feedback" not in told, told
    assert f"left out: mallory {half}" in said and "--labels-from key:mallory" in said, said
    assert f"{N} by shadow agreement" in said
    assert RunStore(runs / "default").manifest()["import"]["labels"] == {
        "from": ["admin"],
        "used": {},
        "left_out": {"mallory": half},
        "roles": {"mallory": "client"},
    }
    # the operator may still choose to trust a key (a single-tenant service's own application)
    cli(*base, "--run", "trusted", "--labels-from", "key:mallory")
    assert RunStore(runs / "trusted").manifest()["import"]["labels"]["used"] == {"mallory": half}
    threshold, told = calibrated(cfg, runs, "trusted")
    assert threshold == 0.0 and f"{half} by feedback (labels of mallory: {half})" in told
    # a giver named without saying key: or team: is refused, not silently taken as nobody
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*base, "--run", "typo", "--labels-from", "mallory"]) != 0
    assert "--labels-from" in err.getvalue() and not (runs / "typo").exists()


def test_each_pair_is_labelled_by_its_reviewers_latest_label_and_the_agreement_rule(tmp_path: Path) -> None:
    from dataclasses import replace

    from evals.ledger_import import Givers, read_ledger
    from router.ledger.entries import Feedback, ShadowPair
    from router.ledger.store import SQLiteStore
    from tests.support.ledger import attempt, entry

    path = tmp_path / "ledger.sqlite3"
    s = SQLiteStore(path)
    s.open()
    # (agreed, the latest label's score); the last pair has no label
    cases = [(True, 1.0), (True, 0.0), (False, 0.75), (False, 0.25), (False, None)]
    for i, (agree, score) in enumerate(cases):
        s.write(entry(f"r{i}", 10.0 + i, attempts=(attempt(0, "small"),)))
        s.write(entry(f"s{i}", 10.0 + i, key="_shadow", attempts=(attempt(0, "large"),)))
        pair = ShadowPair(
            f"r{i}", f"s{i}", 20.0 + i, "small", "large", "maths", 0.5, 0.0, {}, agree, "number", "", None, None,
            "p", "a", "s", 0.0, prompt_json='{"prompt":"What is 1 + 1?"}', answer_text=f"a{i}", shadow_text=f"b{i}",
        )  # fmt: skip
        s.write_pair(pair)
        if score is not None:  # a reviewer's, corrected; then the client's, the other way, which never decides
            s.write_feedback(Feedback(f"fb-{i}-0", f"r{i}", 30.0 + i, "root", 1.0 - score, role="admin"))
            s.write_feedback(Feedback(f"fb-{i}-1", f"r{i}", 40.0 + i, "root", score, role="admin"))
            s.write_feedback(Feedback(f"fb-{i}-2", f"r{i}", 45.0 + i, "alice", 1.0 - score, role="client"))
    # the unlabelled pair: a client's label, and one posted before roles were recorded (read as a client's)
    s.write_feedback(Feedback("fb-4-c", "r4", 46.0, "alice", 1.0, role="client", team="lab"))
    s.write_feedback(Feedback("fb-4-old", "r4", 47.0, "old", 0.0))
    s.write(replace(entry("alone", 50.0, attempts=(attempt(0, "small"),))))
    s.write_feedback(Feedback("fb-alone", "alone", 51.0, "root", 1.0, role="admin"))  # labelled, no pair to import
    s.close()
    read = read_ledger(path)
    assert (read.labelled, read.labelled_elsewhere) == (4, 1)
    assert read.provenance() == {
        "from": ["admin"],
        "used": {"root": 4},
        "left_out": {"alice": 5, "old": 1},
        "roles": {"alice": "client", "old": "client", "root": "admin"},
    }
    keys = [r.key for r in read.records]
    assert [k["correct"] if k else None for k in keys] == [
        {"small": True, "large": True},  # agreed with a right answer: right
        {"small": False, "large": False},  # agreed with a wrong one: wrong
        {"small": True, "large": False},  # disagreed with a right one: wrong
        {"small": False, "large": True},  # disagreed with a wrong one: unknown, taken as right (the proxy)
        {"small": False, "large": True},  # no label: shadow agreement, as before
    ]
    assert [k.get("source") for k in keys if k] == ["feedback"] * 4 + ["shadow_agreement"]
    assert [k.get("top_by_proxy") for k in keys if k] == [False, False, False, True, None]
    # the operator trusts alice's team: her label grades the pair no reviewer labelled, and only that one
    lab = read_ledger(path, givers=Givers.parse(["team:lab"]))
    fifth = lab.records[4].key
    assert fifth is not None and fifth["source"] == "feedback"
    assert fifth["correct"] == {"small": True, "large": False}  # disagreed with an answer labelled right
    assert [r.key["correct"] for r in lab.records[:4] if r.key] == [k["correct"] for k in keys[:4] if k]
    # (her other labels were posted before she was in the team: the team a label carries is its giver's then)
    assert lab.provenance()["used"] == {"alice": 1, "root": 4}
    assert lab.provenance()["left_out"] == {"alice": 4, "old": 1}
    # a label with no recorded role is read only when its key is named; the latest trusted one decides
    old = read_ledger(path, givers=Givers.parse(["key:old", "key:alice"]))
    assert old.records[4].key is not None and old.records[4].key["correct"] == {"small": False, "large": True}
    assert old.provenance()["used"] == {"old": 1, "root": 4} and old.provenance()["from"] == [
        "admin",
        "key:alice",
        "key:old",
    ]
