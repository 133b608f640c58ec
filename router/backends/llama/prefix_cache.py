"""The prefix cache: prompt KV kept after a sequence leaves, for newcomers that share its start.

Its own module because admission, release and the scoring shortcut (`scoring`) all read it, and
because it is the one piece of engine state that outlives a request.

Every entry carries the tenant that left it (`Job.tenant`), and a newcomer reads only its own
tenant's (`of`). A prefix reused is a prompt answered sooner: read across tenants, the cache told
anyone who timed a guess of another tenant's system prompt whether it was right (116 ms against
6.7 s, issue 38), and how much of it was (a guess right to 95% of its words came back in a tenth
of the time of a wrong one), enough to read a prompt out piece by piece. Entries of two tenants
are kept apart even when their tokens are the same; the slots and the KV cells are shared, so
which entries are evicted first depends on everyone's traffic (a tenant can learn how busy the
tier is from its own entries' lifetimes, not what another sent).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def leading(flags: Sequence[bool]) -> int:
    """How many of `flags` hold before the first that does not."""
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _CacheEntry:
    seq_id: int
    tokens: list[int]
    used: float
    tenant: str  # whose prompt this was (`Job.tenant`): only that tenant's jobs read it


class PrefixCache:
    """Prompt KV kept after a sequence leaves, under spare sequence ids, reused by newcomers that
    share a prefix (system prompts, few-shot examples, tool lists). Engine thread only."""

    MIN = 16  # shorter shared prefixes are not worth a lookup

    def __init__(self, first_id: int, slots: int) -> None:
        self.slots = slots
        self.first_id = first_id
        self.free = list(range(first_id + slots - 1, first_id - 1, -1))
        self.entries: list[_CacheEntry] = []
        self.lookups = 0
        self.hits = 0
        self.tokens_saved = 0

    @property
    def cells(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def clear(self) -> None:
        """Forget every entry (their KV went with a freed context); the counters stay."""
        self.free = list(range(self.first_id + self.slots - 1, self.first_id - 1, -1))
        self.entries = []

    def of(self, tenant: str) -> list[_CacheEntry]:
        """The entries a job of this tenant may start from: its own, and no other's."""
        return [e for e in self.entries if e.tenant == tenant]

    def touch(self, seq_id: int) -> None:
        for e in self.entries:
            if e.seq_id == seq_id:
                e.used = time.monotonic()

    def store(self, mem: Any, src_seq: int, tokens: list[int], tenant: str) -> None:
        """Keep the first `tokens` of sequence `src_seq` for later jobs of `tenant`; an entry of its
        own that this one extends is dropped, and one that covers it already makes this a no-op."""
        import llama_cpp as lc

        if self.slots == 0 or len(tokens) < self.MIN:
            return
        for e in self.of(tenant):
            if common_prefix(e.tokens, tokens) == len(e.tokens):  # an older, shorter copy
                self._drop(mem, e)
            elif common_prefix(e.tokens, tokens) == len(tokens):  # already covered
                e.used = time.monotonic()
                return
        if not self.free:
            self._drop(mem, min(self.entries, key=lambda e: e.used))
        sid = self.free.pop()
        lc.llama_memory_seq_cp(mem, src_seq, sid, 0, len(tokens))
        self.entries.append(_CacheEntry(sid, list(tokens), time.monotonic(), tenant))

    def evict_until(self, mem: Any, cells: int) -> None:
        freed = 0
        for e in sorted(self.entries, key=lambda e: e.used):
            if freed >= cells:
                break
            freed += len(e.tokens)
            self._drop(mem, e)

    def _drop(self, mem: Any, entry: _CacheEntry) -> None:
        import llama_cpp as lc

        lc.llama_memory_seq_rm(mem, entry.seq_id, -1, -1)
        self.entries.remove(entry)
        self.free.append(entry.seq_id)
