"""The PostgreSQL-wire server (``dpsql serve``): docs/server.md."""

from dpsql.interfaces.server.app import DEFAULT_PORT, Server, serve

__all__ = ["DEFAULT_PORT", "Server", "serve"]
