"""SQL: parsing, compiling onto declared domains, DuckDB as the oracle."""
