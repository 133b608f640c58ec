"""Per-key budgets and rate limits: the arithmetic with a fake clock, then 429s over real HTTP."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
from pathlib import Path

import openai
import pytest

from router.admission.auth import Principal
from router.admission.limits import Limits, RateLimiter, day_start, month_start
from router.config import ApiKeyEntry
from router.errors import QuotaError, RateLimitError
from tests.support.accounting import auth, chat, config_with_keys, read_ledger, running

T0 = float(calendar.timegm((2025, 3, 31, 23, 59, 0)))  # one minute before a day and a month end


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def principal(**limits: float | int) -> Principal:
    entry = ApiKeyEntry(name="k", hash="sha256$" + "0" * 64, **limits)  # type: ignore[arg-type]
    return Principal("k", entry)


def limits_for(p: Principal, wall: Clock, mono: Clock) -> Limits:
    assert p.entry is not None
    return Limits([p.entry], clock=wall, monotonic=mono, hold_ttl_s=300)


def test_periods_are_utc_calendar_days_and_months() -> None:
    assert day_start(T0) == calendar.timegm((2025, 3, 31, 0, 0, 0))
    assert month_start(T0) == calendar.timegm((2025, 3, 1, 0, 0, 0))
    assert day_start(T0 + 60) == calendar.timegm((2025, 4, 1, 0, 0, 0)) == month_start(T0 + 60)


def test_sliding_window_rate_limit() -> None:
    mono = Clock(1000.0)
    rl = RateLimiter(mono)
    rl.acquire("k", 2)
    mono.t += 10
    rl.acquire("k", 2)
    mono.t += 5
    with pytest.raises(RateLimitError) as err:
        rl.acquire("k", 2)
    assert err.value.retry_after == pytest.approx(45.0)  # the first one leaves the window at +60
    rl.acquire("other", 2)  # keys are counted apart
    mono.t += 45
    rl.acquire("k", 2)
    with pytest.raises(RateLimitError) as err:
        rl.acquire("k", 2)
    assert err.value.retry_after == pytest.approx(10.0)


def test_daily_budget_counts_spend_and_reservations_and_resets_at_midnight() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    p = principal(usd_per_day=1.0)
    lim = limits_for(p, wall, mono)
    h = lim.admit(p, "r1", 0.5)
    assert h.reserved_usd == 0.5 and lim.reserved("k") == 0.5
    lim.charge("k", 0.1, wall.t)  # settled: its actual cost is charged, its reservation released
    h.release()
    assert lim.reserved("k") == 0.0
    h2 = lim.admit(p, "r2", 0.4)
    lim.admit(p, "r3", 0.4)  # 0.1 spent + 0.4 + 0.4 reserved <= 1.0
    with pytest.raises(QuotaError, match="may cost up to \\$0.400000"):
        lim.admit(p, "r4", 0.4)  # 0.1 + 0.8 + 0.4 > 1.0: refused before it can overshoot
    lim.admit(p, "r4", 0.1).release()  # a smaller request still fits exactly
    assert lim.in_flight == 2
    h2.release()
    lim.hold("r3").release()  # type: ignore[union-attr]
    lim.charge("k", 0.9, wall.t)  # spent exactly the budget: nothing more, even for free
    with pytest.raises(QuotaError, match="exceeded your current quota"):
        lim.admit(p, "r5", 0.0)
    assert lim.spent("k") == (pytest.approx(1.0), pytest.approx(1.0))
    wall.t += 61  # 00:00:01 UTC, April 1st: a new day and a new month
    assert lim.spent("k") == (0.0, 0.0)
    lim.admit(p, "r6", 1.0).release()


def test_reservations_hold_a_burst_from_the_first_request() -> None:
    """Nothing learned yet (a fresh process): each request reserves its worst case, so a burst
    admits only what fits, however many arrive before any settles."""
    wall, mono = Clock(T0), Clock(0.0)
    p = principal(usd_per_day=1.0)
    lim = limits_for(p, wall, mono)
    lim.seed({"k": 0.99}, {"k": 0.99}, wall.t)  # $0.01 left
    admitted = []
    for i in range(500):
        with contextlib.suppress(QuotaError):
            admitted.append(lim.admit(p, f"r{i}", 0.003))
    assert len(admitted) == 3  # 0.99 + 3 x 0.003 <= 1.0 < 0.99 + 4 x 0.003
    for h in admitted:
        lim.charge("k", h.reserved_usd, wall.t)  # each cost all it could
        h.release()
    assert lim.spent("k")[0] <= 1.0


def test_every_release_path_reports_the_count() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    p = principal(usd_per_day=1.0)
    seen: list[int] = []
    lim = Limits([p.entry], clock=wall, monotonic=mono, hold_ttl_s=300, on_change=seen.append)  # type: ignore[list-item]
    a = lim.admit(p, "a", 0.1)
    lim.admit(p, "b", 0.1)
    a.release()
    a.release()  # twice: nothing more happens
    mono.t += 301  # b is forgotten: its expiry is a release too
    lim.admit(p, "c", 0.1).release()
    assert seen == [1, 2, 1, 0, 1, 0]
    assert lim.in_flight == 0 and lim.reserved("k") == 0.0


def test_monthly_budget_outlives_the_day() -> None:
    wall, mono = Clock(T0 - 86400 * 2), Clock(0.0)
    p = principal(usd_per_day=10.0, usd_per_month=1.0)
    lim = limits_for(p, wall, mono)
    lim.seed({}, {"k": 0.999}, wall.t)
    lim.admit(p, "a").release()
    lim.charge("k", 0.01, wall.t)
    wall.t += 86400  # a new day, same month
    with pytest.raises(QuotaError, match="monthly budget"):
        lim.admit(p, "b")


def test_a_hold_past_its_lifetime_is_charged_its_reservation_until_it_settles() -> None:
    """A request that outlives its hold (a stalled stream, a forgotten hold) may have spent up to
    its reservation: expiry charges that, so a burst admitted after it cannot spend it again; a
    settle that comes later replaces the charge with the actual cost."""
    wall, mono = Clock(T0), Clock(0.0)
    p = principal(usd_per_day=1.0)
    lim = limits_for(p, wall, mono)
    late = lim.admit(p, "late", 0.6)
    with pytest.raises(QuotaError):
        lim.admit(p, "x", 0.6)
    mono.t += 301
    with pytest.raises(QuotaError):  # expired: charged 0.6, so 0.6 more does not fit
        lim.admit(p, "y", 0.6)
    assert lim.in_flight == 0 and lim.spent("k")[0] == pytest.approx(0.6)
    # the late request settles at its actual cost, as Accounting.record charges it
    lim.charge("k", 0.1 - late.charged_usd, wall.t)
    late.release()
    assert lim.spent("k")[0] == pytest.approx(0.1)
    lim.admit(p, "z", 0.6).release()


def test_zero_budget_refuses_everything_and_budget_refusals_spend_no_rate() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    p = principal(usd_per_day=0.0, requests_per_minute=1)
    lim = limits_for(p, wall, mono)
    for reserve in (0.0, 0.0, 1e-9):
        with pytest.raises(QuotaError):
            lim.admit(p, "r", reserve)
    assert not lim.rate._seen.get("k")


# ---- over HTTP --------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_budget_exhaustion_gets_insufficient_quota(tmp_path: Path, smol_path: Path) -> None:
    # room for one request's worst case (the small tier's whole timeout at its hourly price) and
    # a nanodollar: once the first has cost anything, the second no longer fits
    worst = 0.10 * 120 / 3600
    cfg, keys = config_with_keys(
        tmp_path, {"tiny": {"usd_per_day": worst + 1e-9}, "rich": {"usd_per_day": 100.0}}, large="none"
    )
    async with running(cfg) as client:
        first = await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["tiny"]))
        assert first.status_code == 200
        assert first.json()["tierroute"]["cost_usd"] > 1e-9
        refused = await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["tiny"]))
        assert refused.status_code == 429
        err = refused.json()["error"]
        assert err["type"] == "insufficient_quota" and err["code"] == "insufficient_quota"
        assert "tiny" in err["message"] and keys["tiny"] not in refused.text
        stream = await client.post("/v1/chat/completions", json=chat("Hi.", stream=True), headers=auth(keys["tiny"]))
        assert stream.status_code == 429  # refused before any generation, streaming or not
        ok = await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["rich"]))
        assert ok.status_code == 200
    # refused requests cost nothing and are not in the ledger
    assert sorted(e.key_id for e in read_ledger(tmp_path / "ledger.sqlite3").values()) == ["rich", "tiny"]

    # a restart reads today's spend back from the ledger: the key is still out of budget
    async with running(cfg) as client:
        again = await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["tiny"]))
        assert again.status_code == 429 and again.json()["error"]["code"] == "insufficient_quota"


@pytest.mark.timeout(300)
async def test_rate_limit_gets_429_with_retry_after(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"slow": {"requests_per_minute": 2}, "other": {}}, large="none")
    async with running(cfg) as client:
        codes = []
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=2), headers=auth(keys["slow"]))
            codes.append(r.status_code)
        third = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=2), headers=auth(keys["slow"]))
        assert codes == [200, 200]
        assert third.status_code == 429
        assert 1 <= int(third.headers["retry-after"]) <= 60
        assert third.json()["error"]["code"] == "rate_limit_exceeded"
        other = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=2), headers=auth(keys["other"]))
        assert other.status_code == 200


@pytest.mark.timeout(300)
async def test_openai_client_sees_the_openai_errors(tmp_path: Path, smol_path: Path) -> None:
    """What an existing OpenAI client does with our 429s: RateLimitError carrying the code."""
    cfg, keys = config_with_keys(tmp_path, {"k": {"usd_per_day": 0.0}}, large="none")
    async with running(cfg) as client:
        oai = openai.AsyncOpenAI(base_url="http://tierroute/v1", api_key=keys["k"], http_client=client, max_retries=0)
        with pytest.raises(openai.RateLimitError) as err:
            await oai.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert err.value.code == "insufficient_quota"


@pytest.mark.timeout(300)
async def test_failed_requests_release_their_reservation(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"k": {"usd_per_day": 50.0}}, large="none")
    async with running(cfg) as client:
        limits = client.app.state.services.accounting.limits  # type: ignore[attr-defined]
        bad = chat("x" * 20000, max_tokens=8)  # longer than the context: 400 after admission
        results = await asyncio.gather(
            client.post("/v1/chat/completions", json=bad, headers=auth(keys["k"])),
            client.post("/v1/chat/completions", json={**bad, "stream": True}, headers=auth(keys["k"])),
            client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["k"])),
            client.post("/v1/chat/completions", json=chat("Hi.", stream=True), headers=auth(keys["k"])),
        )
        assert [r.status_code for r in results][2:] == [200, 200]
        assert all(r.status_code >= 400 for r in results[:2])
        assert limits.in_flight == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("limits", "code"),
    [({"usd_per_day": 1e-9}, "insufficient_quota"), ({"tokens_per_minute": 10}, "rate_limit_exceeded")],
    ids=["budget", "token-rate"],
)
def test_a_request_alone_over_its_limit_is_not_retried_by_the_openai_client(
    tmp_path: Path, limits: dict[str, float], code: str
) -> None:
    # the attack review's finding: the openai SDK retries every 429, so one call over a budget or
    # token rate no wait can make room for was sent three times; `x-should-retry: false` stops it
    from router.api.app import create_app
    from router.backends.instant import InstantBackend
    from router.config import load_settings
    from tests.support.servers import UvicornThread

    cfg, keys = config_with_keys(tmp_path, {"k": limits}, large="none")
    settings = load_settings(cfg)
    app = create_app(settings, backends={t.name: InstantBackend(t.name) for t in settings.tiers})
    posts: list[str] = []

    async def counted(scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            posts.append(str(scope["path"]))
        await app(scope, receive, send)  # type: ignore[arg-type]

    with UvicornThread(counted) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=keys["k"], max_retries=2)
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "Hi " * 50}], max_tokens=32
            )
        assert err.value.code == code and "alone" in err.value.message
        assert err.value.response.headers["x-should-retry"] == "false"
    assert posts == ["/v1/chat/completions"]  # one call, one request: the SDK did not retry
