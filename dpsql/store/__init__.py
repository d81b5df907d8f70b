"""Store: the DuckDB database's internal tables (ledger, releases, caches, measurements) and result tables."""
