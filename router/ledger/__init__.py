"""The cost ledger: what every request cost and how it ended, in SQLite or PostgreSQL.

Its modules, bottom up: `entries` (what is recorded, and the store interface), `schema` (the
tables, described once; both stores' DDL is generated from it), `rows` (values to rows and back,
by column name), `store` (SQLite), `postgres` (PostgreSQL, shared by replicas), `stores` (which
store a location names) and `writer` (the thread every write goes through).
"""
