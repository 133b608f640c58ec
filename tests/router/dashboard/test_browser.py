"""The dashboard in a real browser: Debian's chromium, headless, driven by selenium through
chromedriver, against `tierroute serve` on a seeded SQLite ledger.

What must hold, read off the page as a person's browser renders it: each page's figures equal
`tierroute report costs` / `report quality` on the same ledger (the numbers each table cell
carries, and the text it shows); a visit without a key shows only the key form, and a client key
or a wrong key is refused with the service's own message; the key is in no URL the browser
asked for, not in the page's source, not in the server's log; no request leaves the service's
origin; the Content-Security-Policy reports no violation; and the markup in a task name, a model
name and a label's comment stays text (no element made from it, no script run). Screenshots of
each page go to `TIERROUTE_DASHBOARD_SHOTS` (docs/images when regenerating the docs' pictures),
else to the test's temporary directory.

The browser is Debian's (`make browser`); where it is missing or cannot start the tests skip and
say so. Kept short: one server and one browser for the module.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.config import write_config
from tests.support.control import control_config
from tests.support.dashboard import XSS, seed
from tests.support.servers import TIERROUTE, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--window-size=1280,1900",
)
PAGES = ("overview", "quality", "latency", "keys", "evals")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dashboard")
    ledger = tmp / "ledger.sqlite3"
    counts = seed(ledger)
    cfg, raw = control_config(
        tmp,
        "http://127.0.0.1:9/v1",  # never asked: the ledger is seeded, no request is served
        ledger=str(ledger),
        keys={"viewer": {"roles": ["report"]}, "ana": {"usd_per_day": 0.5}, "bob": {"usd_per_month": 2.0}},
    )
    write_config(cfg, cfg.read_text() + f'\n[dashboard]\neval_report = "{ROOT / "docs" / "eval"}"\n')
    log = tmp / "serve.log"
    with serve_process(cfg, log_path=log) as (_, url, _output):
        yield {"url": url, "raw": raw, "cfg": cfg, "ledger": ledger, "log": log, "counts": counts}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("Debian's chromium and chromium-driver are not installed (`make browser` installs them)")
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ARGS:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as exc:
        pytest.skip(f"chromium could not start headless here: {exc.msg}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shots(tmp: Path) -> Path:
    where = os.environ.get("TIERROUTE_DASHBOARD_SHOTS")
    path = Path(where) if where else tmp
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wait(driver: Any, condition: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.execute_script(f"return Boolean({condition});"):
            return
        time.sleep(0.05)
    raise AssertionError(f"the page never came to: {condition}; status: {driver.find_element('id', 'status').text!r}")


def _enter_key(driver: Any, key: str) -> None:
    field = driver.find_element("id", "key")
    field.clear()
    field.send_keys(key)
    driver.find_element("css selector", "#login button[type=submit]").click()


def _open(driver: Any, page: str) -> None:
    driver.execute_script("location.hash = arguments[0];", page)
    _wait(driver, f"document.body.dataset.state === 'ready' && document.body.dataset.page === '{page}'")


def _cells(driver: Any, table: str) -> list[dict[str, tuple[str, float | None]]]:
    """Each row of the table as field -> (text shown, the number the cell carries)."""
    found: list[dict[str, tuple[str, float | None]]] = driver.execute_script(
        """
        return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].map((tr) => Object.fromEntries(
          [...tr.querySelectorAll('td')].map((td) => [td.dataset.field,
            [td.textContent, td.dataset.value === undefined ? null : Number(td.dataset.value)]])));
        """,
        table,
    )
    return found


def _report(*args: str) -> list[dict[str, str]]:
    out = subprocess.run([TIERROUTE, "report", *args], capture_output=True, text=True, timeout=120, check=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def _costs(served: dict[str, Any], by: str) -> dict[str, dict[str, str]]:
    rows = _report("costs", "--config", str(served["cfg"]), "--since", "7d", "--by", by, "--format", "csv")
    return {r[by]: r for r in rows}


def _same(page: float | None, report: str) -> bool:
    return (page is None and report == "") or (page is not None and report != "" and page == float(report))


def test_every_page_shows_the_reports_figures(served: dict[str, Any], browser: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    driver, url, shots = browser, served["url"], _shots(tmp_path)
    driver.get(f"{url}/ui/")
    driver.execute_script("sessionStorage.clear();")
    driver.get(f"{url}/ui/")
    _enter_key(driver, served["raw"]["viewer"])
    _wait(driver, "document.body.dataset.state === 'ready'")

    # Overview: tiers, tasks and days, each cell's number exactly the report's
    _open(driver, "overview")
    by_tier = _costs(served, "tier")
    tiers = _cells(driver, "tiers")
    assert {r["group"][0] for r in tiers} == set(by_tier), tiers
    for row in tiers:
        want = by_tier[row["group"][0]]
        for field in (
            "requests",
            "cost_usd",
            "top_tier_usd",
            "savings_usd",
            "savings_pct",
            "escalation_rate",
            "p50_ms",
        ):
            assert _same(row[field][1], want[field]), (row["group"], field, row[field], want[field])
    total = by_tier["TOTAL"]
    assert driver.find_element("id", "kpi-cost").text == f"${float(total['cost_usd']):,.6f}"
    assert driver.find_element("id", "kpi-top").text == f"${float(total['top_tier_usd']):,.6f}"
    by_task = _costs(served, "task")
    tasks = _cells(driver, "tasks")
    assert {r["group"][0] for r in tasks} == set(by_task) - {"TOTAL"}
    for row in tasks:
        want = by_task[row["group"][0]]
        assert _same(row["requests"][1], want["requests"]) and _same(row["escalation_rate"][1], want["escalation_rate"])
        assert row["escalation_rate"][0] == f"{100 * float(want['escalation_rate']):.1f}%"
    by_day = _costs(served, "day")
    days = _cells(driver, "days")
    assert [r["day"][0] for r in days] == sorted(set(by_day) - {"TOTAL"})
    for row in days:
        assert _same(row["cost_usd"][1], by_day[row["day"][0]]["cost_usd"])
    driver.save_screenshot(str(shots / "dashboard-overview.png"))

    # Quality: every row of `report quality --csv` (its floats at six places), and no alarm text lost
    _open(driver, "quality")
    quality = _report("quality", "--config", str(served["cfg"]), "--since", "7d", "--csv")
    rows = _cells(driver, "quality")
    assert len(rows) == len(quality) > 0
    for row, want in zip(rows, quality, strict=True):
        assert (row["tier"][0], row["task"][0]) == (want["tier"], want["task"])
        for field in ("tried", "pairs", "labelled"):
            assert row[field][1] == int(want[field])
        for field in ("agreement", "wilson_low", "wilson_high", "label_accuracy", "label_low", "label_high"):
            page = row[field][1]
            assert (page is None) == (want[field] == ""), (field, row, want)
            if page is not None:
                assert abs(page - float(want[field])) < 5e-7, (field, page, want[field])
    driver.save_screenshot(str(shots / "dashboard-quality.png"))

    # Latency: the tier rows' percentiles; the breaker of each tier shown live
    _open(driver, "latency")
    for row in _cells(driver, "latency"):
        want = by_tier[row["tier"][0]]
        assert _same(row["p50_ms"][1], want["p50_ms"]) and _same(row["p95_ms"][1], want["p95_ms"])
    assert {r["tier"][0] for r in _cells(driver, "backends")} == {"small", "large"}
    driver.save_screenshot(str(shots / "dashboard-latency.png"))

    # Keys and teams: the spenders as `--by key`, the budgets of ana and bob
    _open(driver, "keys")
    by_key = _costs(served, "key")
    for row in _cells(driver, "spenders"):
        assert _same(row["cost_usd"][1], by_key[row["group"][0]]["cost_usd"])
    budgets = {r["name"][0]: r for r in _cells(driver, "budgets")}
    assert set(budgets) == {"ana", "bob"} and budgets["ana"]["usd_per_day"][1] == 0.5
    driver.save_screenshot(str(shots / "dashboard-keys.png"))

    # Evals: the committed report's calibrated points, one per row of its sweep
    _open(driver, "evals")
    suite = driver.find_element("id", "suite").get_attribute("value")
    with (ROOT / "docs" / "eval" / "sweep.csv").open() as f:
        marked = [r for r in csv.DictReader(f) if r["suite"] == suite and r["kind"].startswith("calibrated")]
    shown = _cells(driver, "calibrated")
    assert len(shown) == len(marked) > 0
    assert sorted(r["accuracy"][1] for r in shown) == sorted(float(r["accuracy"]) for r in marked)  # type: ignore[type-var]
    assert driver.execute_script("return document.querySelectorAll('svg circle.mark').length;") > 0
    driver.save_screenshot(str(shots / "dashboard-evals.png"))

    _no_markup_ran(driver)
    _key_nowhere(served, driver)
    assert time.monotonic() - started < 30, "the browser checks should stay short"


def _no_markup_ran(driver: Any) -> None:
    """The seeded markup is on the page as text, made no element, ran no script."""
    _open(driver, "overview")
    assert driver.title == "tierroute dashboard"
    assert driver.execute_script("return document.querySelectorAll('main img, main script, main iframe').length;") == 0
    assert XSS in driver.find_element("id", "tasks").text
    violations = [e for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
    assert not violations, violations


def _key_nowhere(served: dict[str, Any], driver: Any) -> None:
    """No URL the browser asked for holds the key, nor leaves the service's origin; the page's
    source and the server's log hold no key."""
    asked = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            asked.append(message["params"]["request"]["url"])
    assert asked, "the performance log recorded no request"
    for u in asked:  # the page's own files and JSON, and the browser's own favicon.ico: this origin only
        assert u.startswith(served["url"] + "/"), u
    source = driver.page_source + httpx.get(f"{served['url']}/ui/").text
    log = served["log"].read_text(errors="replace")
    for name, key in served["raw"].items():
        assert all(key not in u for u in asked), name
        assert key not in source, name
        assert key not in log, name


@pytest.mark.parametrize(("who", "status"), [("ana", "403"), ("wrong", "401")], ids=["client key", "wrong key"])
def test_a_key_without_the_report_role_is_refused(served: dict[str, Any], browser: Any, who: str, status: str) -> None:
    driver = browser
    driver.get(f"{served['url']}/ui/")
    driver.execute_script("sessionStorage.clear();")
    driver.get(f"{served['url']}/ui/")
    assert driver.find_element("id", "login").is_displayed()  # no key yet: the form, no figures
    assert driver.execute_script("return document.querySelectorAll('main *').length;") == 0
    _enter_key(driver, served["raw"].get(who, "trk-not-a-key"))
    _wait(driver, "document.body.dataset.state === 'refused'")
    assert driver.find_element("id", "status").text.startswith(f"Refused ({status})")
    assert driver.execute_script("return document.querySelectorAll('main *').length;") == 0
    assert driver.execute_script("return sessionStorage.length;") == 0  # a refused key is not kept


def test_the_api_refuses_anonymous_and_client_callers(served: dict[str, Any]) -> None:
    for page in PAGES:
        r = httpx.get(f"{served['url']}/ui/api/{page}")
        assert r.status_code == 401 and "content-security-policy" in r.headers
        r = httpx.get(f"{served['url']}/ui/api/{page}", headers={"Authorization": f"Bearer {served['raw']['ana']}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_a_report_key"


def test_a_window_no_clock_can_show_is_refused_before_anything_is_read(served: dict[str, Any]) -> None:
    """An outside review: `since=99999999999999999999d` read the whole ledger, then failed with a
    500 that carried none of the page's security headers."""
    viewer = {"Authorization": f"Bearer {served['raw']['viewer']}"}
    for query in ("since=99999999999999999999d", "until=9999-12-31", "since=1900-01-01"):
        r = httpx.get(f"{served['url']}/ui/api/overview?{query}", headers=viewer, timeout=30)
        assert r.status_code == 400, (query, r.text)
        assert r.json()["error"]["code"] == "invalid_window"
        assert "content-security-policy" in r.headers
    assert httpx.get(f"{served['url']}/ui/api/overview?since=all", headers=viewer, timeout=60).status_code == 200
