"""SQL: parse the analyst's batch (allow-list) and compile it onto the declared domain."""
