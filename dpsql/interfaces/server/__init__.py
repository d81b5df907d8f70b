"""The PostgreSQL-wire server (``dpsql serve``): docs/server.md.

``DEFAULT_PORT``, ``Server`` and ``serve`` are imported on first use (PEP 562), so ``dpsql
--help``, which adds ``serve`` and ``user`` from :mod:`dpsql.interfaces.server.cli`, does
not load the server (and with it the release path).
"""

__all__ = ["DEFAULT_PORT", "Server", "serve"]


def __getattr__(name: str):
    """The server's names, imported when first asked for (and then bound here)."""
    if name not in __all__:
        raise AttributeError(f"module 'dpsql.interfaces.server' has no attribute {name!r}")
    from dpsql.interfaces.server import app

    value = getattr(app, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
