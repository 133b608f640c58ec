"""The cost ledger: what every request cost and how it ended, in SQLite or PostgreSQL."""
