"""Interfaces: the CLI, the shell, the DB-API driver, scripts, settings and errors."""
