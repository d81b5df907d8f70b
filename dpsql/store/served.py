"""A database file owned by a running ``dpsql serve``: say so, instead of waiting on a lock.

While the PostgreSQL-wire server runs it writes ``DB.dpsql-server`` (JSON: its address and
process id) next to the file and removes it when it stops (:mod:`dpsql.interfaces.server.app`).
Every other way in — :func:`dpsql.connect`, :func:`dpsql.dbapi.connect`, each command-line
subcommand — opens the file through :class:`dpsql.store.database.Database`, which calls
:func:`check` first: a live server's marker is refused at once, in one line naming its
address and pid and how to connect through it (:class:`~dpsql.errors.LockTimeoutError`:
"database busy in another process", exit status 75, SQLSTATE 55P03, DB-API
OperationalError). A stale marker (its process is gone, or the pid now runs something that
is not dpsql) is ignored, and so is the server's own process.
"""

from __future__ import annotations

import json
import os

from dpsql.errors import LockTimeoutError

SUFFIX = ".dpsql-server"


def marker_path(path: str) -> str:
    """Where the server that owns database ``path`` writes its marker."""
    return os.path.abspath(path) + SUFFIX


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process that may be a dpsql server."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # alive, another user's
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"dpsql" in f.read()      # a reused pid running something else: stale
    except OSError:                          # no /proc (not Linux), or gone: trust kill(0)
        return True


def owner(path: str) -> tuple[str, int] | None:
    """(address, pid) of the live server that owns database ``path``, or None (no marker,
    an unreadable or stale one, or this very process is the server)."""
    try:
        with open(marker_path(path), encoding="utf-8") as f:
            marker = json.load(f)
        address, pid = str(marker["address"]), int(marker["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid() or not _alive(pid):
        return None
    return address, pid


def how_to_connect(path: str, address: str) -> str:
    """A psql command and a psycopg DSN for the server at ``address`` (host:port)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    dbname = os.path.splitext(os.path.basename(path))[0] or "dpsql"
    dsn = f"host={host} port={port} user=NAME dbname={dbname}"
    return f'psql "{dsn}", or psycopg.connect("{dsn}")'


def check(path: str) -> None:
    """Refuse at once (one line) a database file that a running dpsql server owns."""
    found = owner(path)
    if found is None:
        return
    address, pid = found
    raise LockTimeoutError(
        f"database {os.path.abspath(path)!r} is owned by the dpsql server at {address} "
        f"(pid {pid}); connect through it: {how_to_connect(path, address)} (see "
        "docs/server.md), or stop the server to open the file directly")
