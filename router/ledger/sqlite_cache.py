"""The response cache's rows in the SQLite ledger (router.cache): one table, `cache_entries`,
bounded as a whole and per scope, oldest first. The cache's half of `SQLiteStore`, as
`postgres_cache.CacheRows` is `PostgresStore`'s."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from router.ledger import rows, schema
from router.ledger.entries import CacheRow

_INSERT_CACHE = rows.insert("cache_entries", "sqlite", "INSERT OR REPLACE INTO")
# the created time past which the response cache evicts: the (max_entries + 1)-th newest, read off
# the created index alone (ordering the table by more than `created` sorted all of it: 0.8-1.4 s
# at 1M entries on the ledger's one thread, against 23-31 ms for this)
EVICT_CUTOFF = "SELECT created FROM cache_entries ORDER BY created DESC LIMIT 1 OFFSET ?"
# the same within one scope, read off the (scope, created) index: its (max_per_scope + 1)-th newest
SCOPE_CUTOFF = "SELECT created FROM cache_entries WHERE scope = ? ORDER BY created DESC LIMIT 1 OFFSET ?"


class CacheRows:
    """The response cache's store half of `SQLiteStore` (which gives it its connection and its
    transactions)."""

    @property
    def conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _transaction(self, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def cache_get(self, cache_key: str, scope: str, now: float) -> CacheRow | None:
        found = self.conn.execute(
            f"SELECT {schema.column_list('cache_entries', 'sqlite')} FROM cache_entries "
            "WHERE cache_key = ? AND scope = ? AND expires_at > ?",
            (cache_key, scope, now),
        ).fetchone()
        return None if found is None else rows.cache_from_row(found)

    def cache_put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None = None) -> None:
        def put() -> None:
            conn = self.conn
            conn.execute(_INSERT_CACHE, rows.cache_values(row))
            conn.execute("DELETE FROM cache_entries WHERE expires_at <= ?", (row.created,))
            if max_per_scope is not None:  # the row's own scope's oldest past its share: no one else's
                own = conn.execute(SCOPE_CUTOFF, (row.scope, max_per_scope)).fetchone()
                if own is not None:
                    conn.execute("DELETE FROM cache_entries WHERE scope = ? AND created <= ?", (row.scope, own[0]))
            if max_entries is None:
                return
            # the newest max_entries stay (an entry stored in the same instant as the cutoff goes too)
            cutoff = conn.execute(EVICT_CUTOFF, (max_entries,)).fetchone()
            if cutoff is not None:
                conn.execute("DELETE FROM cache_entries WHERE created <= ?", (cutoff[0],))

        self._transaction(put)

    def cache_drop(self, cache_key: str) -> None:
        self.conn.execute("DELETE FROM cache_entries WHERE cache_key = ?", (cache_key,))
