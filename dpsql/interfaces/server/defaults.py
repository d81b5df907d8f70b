"""The server's defaults, declared once: ``dpsql serve``'s options
(:mod:`dpsql.interfaces.server.cli`) and :class:`dpsql.interfaces.server.app.Server` read
them from here, a module without imports, so that building ``dpsql``'s parser (``dpsql
--help``) does not load the server."""

#: the address ``dpsql serve`` listens on unless ``--host`` says otherwise (this machine only)
DEFAULT_HOST = "127.0.0.1"
#: PostgreSQL's own port plus one
DEFAULT_PORT = 5433
#: sessions served at once; the next connection is refused (FATAL 53300), never queued
DEFAULT_MAX_CONNECTIONS = 64
