"""The response cache's rows in the PostgreSQL ledger (router.cache): one table, `cache_entries`,
that every replica reads and fills; bounded as a whole and per scope, oldest first."""

from __future__ import annotations

import psycopg_pool
from psycopg.rows import dict_row

from router.ledger import rows, schema
from router.ledger.entries import CacheRow

_INSERT_CACHE = (
    rows.insert("cache_entries", "postgres")
    + " ON CONFLICT (cache_key) DO UPDATE SET "
    + ", ".join(f"{c.quoted} = EXCLUDED.{c.quoted}" for c in schema.columns("cache_entries", "postgres")[1:])
)


class CacheRows:
    """The response cache's store half of `PostgresStore` (which gives it its pool)."""

    @property
    def pool(self) -> psycopg_pool.ConnectionPool:
        raise NotImplementedError

    def cache_get(self, cache_key: str, scope: str, now: float) -> CacheRow | None:
        with self.pool.connection() as conn:
            found = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    f"SELECT {schema.column_list('cache_entries', 'postgres')} FROM cache_entries "
                    "WHERE cache_key = %s AND scope = %s AND expires_at > %s",
                    (cache_key, scope, now),
                )
                .fetchone()
            )
        return None if found is None else rows.cache_from_row(found)

    def cache_put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None = None) -> None:
        with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            conn.execute(_INSERT_CACHE, rows.cache_values(row))
            conn.execute("DELETE FROM cache_entries WHERE expires_at <= %s", (row.created,))
            if max_per_scope is not None:  # the row's own scope's oldest past its share: no one else's
                own = conn.execute(
                    "SELECT created FROM cache_entries WHERE scope = %s ORDER BY created DESC LIMIT 1 OFFSET %s",
                    (row.scope, max_per_scope),
                ).fetchone()
                if own is not None:
                    conn.execute("DELETE FROM cache_entries WHERE scope = %s AND created <= %s", (row.scope, own[0]))
            if max_entries is None:
                return
            # the newest max_entries stay, whichever replica stored them: the cutoff is read off the
            # created index alone (ordering by more than `created` sorted the whole table)
            cutoff = conn.execute(
                "SELECT created FROM cache_entries ORDER BY created DESC LIMIT 1 OFFSET %s", (max_entries,)
            ).fetchone()
            if cutoff is not None:
                conn.execute("DELETE FROM cache_entries WHERE created <= %s", (cutoff[0],))

    def cache_drop(self, cache_key: str) -> None:
        with self.pool.connection() as conn:
            conn.execute("DELETE FROM cache_entries WHERE cache_key = %s", (cache_key,))
