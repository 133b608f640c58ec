"""Issue 38, finding 3, from outside: the llama.cpp prefix cache is no timing oracle across tenants.

The engine keeps prompt KV after a request (the prefix cache) and copies it into a newcomer that
shares the prompt's start, and copies it between sequences running together. Before this, any
tenant's newcomer read any tenant's prefix: a guess of another tenant's system prompt that was
right came back in a fraction of the time of a wrong one, and prompts of concurrent requests were
shared even with `prefix_cache_slots = 0`. Prefixes are now reused only within one tenant (the
key, or its team with `prefix_cache_scope = "team"`), unless the operator sets
`prefix_cache_scope = "global"`.

A real `tierroute serve` process on loopback (SmolLM2 as its one tier, keys for two tenants,
`alice` and `bob`, and an admin key that reads /metrics). `alice` sends requests whose system
prompts are long and new; `bob` then guesses each one, right (the same text) and wrong (the same
words in another order, so the same length), in alternating order, each guess new to him. What is
compared, per guess: the prompt tokens the engine took from a cache
(`tierroute_backend_prefix_cache_tokens_saved`, read before and after each request), which must
be equal for right and wrong guesses; and the latency `bob` measures, whose medians must be
within a ratio of [0.67, 1.5] of each other and which a two-sided Mann-Whitney U test (exact, 8
against 8) must not tell apart at p < 0.001. Before the fix, right guesses saved ~170 tokens each,
wrong ones none, and every right guess was faster than every wrong one.

Reuse within one tenant stays: `alice`'s second request with her system prompt takes it from the
cache, and a second request of hers running beside the first copies its prompt.

Run with -s to see the latencies.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scipy.stats import mannwhitneyu

from tests.support.accounting import keys_section
from tests.support.config import Toml, table, tier, write_config
from tests.support.metrics import samples, value
from tests.support.model import SMOL
from tests.support.servers import serve_process

KEYS: dict[str, dict[str, Any]] = {"root": {"roles": ["admin"]}, "alice": {}, "bob": {}}
GUESSES = 8  # right guesses, and as many wrong ones
WORDS = (
    "river stone lantern copper meadow falcon harbor velvet orchard thunder ribbon canyon maple "
    "glacier pepper saddle violet compass marble willow anchor cobalt ember fable garnet hollow "
    "ivory jasmine kettle lagoon mosaic nectar oyster prism quartz raven spruce tundra umber "
    "valley wagon yonder zephyr amber basil cedar dune fern grove heron iris juniper kelp lotus "
    "mint nova olive pearl quill rust sage thistle urchin vine wren yarrow zinc acorn bramble"
).split()
# SmolLM2's end tokens (<|endoftext|>, <|im_end|>), pushed away so an answer runs to max_tokens
NO_END = {"0": -100, "2": -100}


def secret(i: int) -> list[str]:
    """The words of `alice`'s system prompt number i (about 170 tokens), each starting with a word of
    its own: two of them share no prefix the cache would copy (16 tokens)."""
    words = random.Random(i).choices(WORDS, k=100)
    return [f"Protocol{i}", *words]


def wrong(i: int) -> list[str]:
    """A wrong guess of secret(i): its words in another order, so its length is the same."""
    words = secret(i)[1:]
    random.Random(1000 + i).shuffle(words)
    return [f"Guideline{i}", *words]


def text(words: list[str]) -> str:
    return "Follow these rules exactly: " + " ".join(words)


def server_config(tmp: Path, **engine: object) -> tuple[Path, dict[str, str]]:
    keys, raw = keys_section(KEYS)
    settings = {"model": SMOL, "n_ctx": 4096, "n_threads": 1, "n_parallel": 4, **engine}
    price = {"usd_per_hour": Toml("0.10"), "stands_for": "test small tier"}
    body = f"[server]\n{keys}\n" + table("ledger", {"path": str(tmp / "ledger.sqlite3")})
    body += tier("small", max_tokens=256, timeout_s=120, engine=settings, price=price)
    return write_config(tmp / "config.toml", body), raw


class Service:
    """A served process and its keys: requests as a tenant, the engine's counters as the admin."""

    def __init__(self, url: str, raw: dict[str, str]) -> None:
        self.url = url
        self.raw = raw
        self.client = httpx.Client(base_url=url, timeout=120)

    def saved(self) -> float:
        """Prompt tokens the tier has taken from its caches instead of computing them, so far."""
        r = self.client.get("/metrics", headers=self.auth("root"))
        assert r.status_code == 200, r.text
        return value(samples(r.text), "tierroute_backend_prefix_cache_tokens_saved", tier="small")

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.raw[key]}"}

    def body(self, system: str, question: str, max_tokens: int = 1, **extra: Any) -> dict[str, Any]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return {"model": "small", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}

    def ask(self, key: str, system: str, question: str) -> tuple[float, float, int]:
        """(seconds the caller waited, prompt tokens the engine saved, prompt tokens) of one request."""
        before = self.saved()
        t0 = time.perf_counter()
        r = self.client.post("/v1/chat/completions", json=self.body(system, question), headers=self.auth(key))
        took = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        return took, self.saved() - before, int(r.json()["usage"]["prompt_tokens"])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("prefix-tenants")
    cfg, raw = server_config(tmp)  # the default prefix cache: 4 slots
    with serve_process(cfg, log_path=tmp / "serve.log", log_level="warning") as (_, url, _):
        service = Service(url, raw)
        service.ask("alice", "Warm up.", "Hi")  # the first request's one-off costs paid by nobody measured
        yield service
        service.client.close()


def test_right_and_wrong_guesses_of_another_tenants_prompt_are_indistinguishable(service: Service) -> None:
    right: list[tuple[float, float, int]] = []
    wrong_: list[tuple[float, float, int]] = []
    for i in range(GUESSES):
        # alice's request leaves her prompt in the cache; bob guesses it at once, right and wrong
        # in alternating order (so a drift in the machine's load falls on both alike)
        service.ask("alice", text(secret(i)), "Summarize the rules in one line.")
        guesses = [(right, secret(i)), (wrong_, wrong(i))]
        for into, words in guesses if i % 2 == 0 else guesses[::-1]:
            into.append(service.ask("bob", text(words), "Which rule comes first?"))
    r_time, w_time = [t for t, _, _ in right], [t for t, _, _ in wrong_]
    ratio = statistics.median(r_time) / statistics.median(w_time)
    p = float(mannwhitneyu(r_time, w_time, alternative="two-sided", method="exact").pvalue)
    print(f"\nright guesses (s): {[round(t, 3) for t in r_time]}\nwrong guesses (s): {[round(t, 3) for t in w_time]}")
    print(f"prompt tokens saved: right {[s for _, s, _ in right]}, wrong {[s for _, s, _ in wrong_]}")
    print(f"median ratio right/wrong {ratio:.2f}, Mann-Whitney p = {p:.5f}")
    # the same work: prompts of one length (to a few tokens), and nothing taken from alice's KV
    assert all(abs(r[2] - w[2]) <= 8 for r, w in zip(right, wrong_, strict=True))
    assert [s for _, s, _ in right] == [s for _, s, _ in wrong_] == [0.0] * GUESSES
    assert 0.67 <= ratio <= 1.5, f"right guesses took {ratio:.2f}x the time of wrong ones"
    assert p >= 0.001, f"a rank test tells right guesses from wrong ones (p = {p:.5f})"


def test_a_tenant_still_reuses_its_own_prefix(service: Service) -> None:
    firsts, seconds = [], []
    for i in range(100, 103):
        system = text(secret(i))
        took, saved, prompt = service.ask("alice", system, "Summarize the rules in one line.")
        assert saved == 0.0
        firsts.append(took)
        took, saved, _ = service.ask("alice", system, "Which rule comes first?")
        # all of the system prompt and the template around it, up to where the questions part
        assert saved >= prompt - 16, (saved, prompt)
        seconds.append(took)
    print(f"\nalice first (s) {[round(t, 3) for t in firsts]}, again {[round(t, 3) for t in seconds]}")
    assert statistics.median(seconds) < 0.67 * statistics.median(firsts)


class LongAnswer(threading.Thread):
    """`alice` streaming an answer of 256 tokens to `system` (its end tokens pushed away), from
    a thread; `decoding` is set at its first piece of text, when its prompt is all in the KV."""

    def __init__(self, service: Service, system: str) -> None:
        super().__init__(daemon=True)
        self.service = service
        self.body = service.body(system, "Recite the rules.", max_tokens=256, stream=True, logit_bias=NO_END)
        self.decoding = threading.Event()
        self.finished = threading.Event()

    def run(self) -> None:
        headers = self.service.auth("alice")
        with self.service.client.stream("POST", "/v1/chat/completions", json=self.body, headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    self.decoding.set()
        self.finished.set()


def test_concurrent_requests_share_prompts_only_within_a_tenant(tmp_path: Path, smol_path: Path) -> None:
    """Without any stored prefixes (`prefix_cache_slots = 0`), a newcomer used to copy the prompt of
    a sequence running beside it, whoever sent that one."""
    cfg, raw = server_config(tmp_path, prefix_cache_slots=0)
    with serve_process(cfg, log_path=tmp_path / "serve.log", log_level="warning") as (_, url, _):
        service = Service(url, raw)
        try:
            for n, key in enumerate(("bob", "alice")):
                system = text(secret(200 + n))
                answer = LongAnswer(service, system)
                answer.start()
                assert answer.decoding.wait(120)
                _, saved, prompt = service.ask(key, system, "Which rule comes first?")
                running = not answer.finished.is_set()  # admitted while alice's answer was decoding
                answer.join(120)
                assert answer.finished.is_set() and running
                if key == "alice":  # her own running prompt: copied, not computed again
                    assert saved >= prompt - 16, (saved, prompt)
                else:
                    assert saved == 0.0, f"bob copied {saved} prompt tokens of alice's running request"
        finally:
            service.client.close()
