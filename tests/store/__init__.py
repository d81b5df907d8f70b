"""Store: the schema and its migrations."""
