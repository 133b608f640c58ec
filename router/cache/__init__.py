"""The exact-match response cache: a repeated deterministic request answered without generating.

`keys` says what an answer is keyed by and who may read it, `answer` what is stored and how a
stored row is checked before it is served, `service` the lookups and stores the route makes. The
entries live in the ledger's database (`cache_entries`, `router.ledger.schema`), so every replica
on one PostgreSQL ledger shares them. How it behaves, and why: docs/cache.md.
"""
