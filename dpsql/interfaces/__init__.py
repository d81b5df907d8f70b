"""The ways in: the command line, the shell, the DB-API driver and SQL scripts."""
