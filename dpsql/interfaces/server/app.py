"""``dpsql serve``: the server process, its limits, the audit trail and cancellation.

One thread per connection (:class:`socketserver.ThreadingTCPServer`); each connection
has its own DB-API connection and Session over the shared database file (releases on one
file are serialised by the Session's per-file lock, and the ledger's check-and-charge is
one transaction). At most ``max_connections`` sessions at once: the next one is refused
with SQLSTATE 53300 at startup, never queued. A client that disconnects while its
release runs cancels it if the release has not been charged (through the DB-API
``Connection.cancel()`` when the driver has one); once charged, the release completes and
its result table is written: nothing is lost.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import signal
import socket
import socketserver
import ssl
import threading

from dpsql.errors import UsageError, check_database_path
from dpsql.interfaces.server.accounts import load_users
from dpsql.interfaces.server.defaults import DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT
from dpsql.interfaces.server.journal import Journal
from dpsql.interfaces.server.connection import Handler
from dpsql.interfaces.server.results import Failure
from dpsql.interfaces.exits import lock_notice
from dpsql.request.declared import CONNECTION_SETTINGS, SPARK_SETTINGS, settings_for
from dpsql.session import Session
from dpsql.store import served

#: the connection settings the server passes to every analyst's connection (the command
#: line's --lock-timeout, --max-memory, --time-limit: generated from the declaration)
SERVED_SETTINGS = tuple(s.name for s in settings_for("cli", CONNECTION_SETTINGS)
                        if s.name not in SPARK_SETTINGS)     # Spark: one link, shared


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = False          # server_close() joins them: releases finish first
    block_on_close = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, db_path: str, users_path: str, *, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, certificate: str | None = None,
                 key: str | None = None, require_tls: bool = False,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, spark=None,
                 **connection):
        """``connection``: the connection settings every analyst's DB-API connection gets
        (:data:`dpsql.request.declared.CONNECTION_SETTINGS`: lock_timeout, max_memory,
        time_limit), parsed by their declared parsers."""
        check_database_path(db_path, False, "create it and protect a table first")
        self.db_path = os.path.abspath(db_path)
        served.check(self.db_path)                     # a second server on a served file
        unknown = set(connection) - set(SERVED_SETTINGS)
        if unknown:
            raise UsageError(f"unknown connection setting(s) {sorted(unknown)}; the server "
                             f"takes {', '.join(SERVED_SETTINGS)}")
        self.connection_settings = {name: CONNECTION_SETTINGS[name].parse(value)
                                    for name, value in connection.items() if value is not None}
        self._opens()
        self.users_path = users_path
        load_users(users_path)                         # refuse a bad file at start
        self.journal = Journal(self.db_path + ".analysts.jsonl")
        self.audit_path = self.db_path + ".audit.jsonl"
        self._audit_lock = threading.Lock()
        #: the one way to Spark every connection shares (a dpsql.session.spark_link), or None
        self.spark = spark
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._live: dict = {}
        self._live_lock = threading.Lock()
        self.require_tls = require_tls
        self.ssl_context = None
        if certificate:
            self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ssl_context.load_cert_chain(certificate, key)
        try:
            super().__init__((host, port), Handler)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                             "choose another --host or --port") from None

    def _opens(self) -> None:
        """Open the file once, as every connection will: refused at start (after
        ``--lock-timeout``, the error table's busy row) while another process holds it."""
        lock = self.connection_settings.get("lock_timeout",
                                            CONNECTION_SETTINGS["lock_timeout"].default)
        session = Session(self.db_path, lock_timeout=lock, on_lock_wait=lock_notice())
        try:
            session.policies()
        finally:
            session.close()

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"

    def accounts(self) -> dict:
        """The users file, read at every login (edits apply to new connections)."""
        return load_users(self.users_path)

    # ---------------------------------------------------------------- limits
    def enter(self) -> bool:
        return self._slots.acquire(blocking=False)

    def leave(self) -> None:
        self._slots.release()

    def server_close(self) -> None:
        """Stop: every connection's socket is shut (a release in progress completes and
        is written first), then the connection threads are joined."""
        with self._live_lock:
            handlers = [h for _, h in self._live.values()]
        for h in handlers:
            with contextlib.suppress(OSError):
                h.request.shutdown(socket.SHUT_RDWR)
        super().server_close()
        if self.spark is not None:
            self.spark.close()

    # ---------------------------------------------------------------- cancellation
    def register(self, pid: int, secret: int, handler) -> None:
        with self._live_lock:
            self._live[pid] = (secret, handler)

    def unregister(self, pid: int) -> None:
        with self._live_lock:
            self._live.pop(pid, None)

    def cancel(self, pid: int, secret: int) -> None:
        with self._live_lock:
            entry = self._live.get(pid)
        if entry is not None and entry[0] == secret and entry[1].analyst is not None:
            entry[1].analyst.cancel()

    @contextlib.contextmanager
    def watch(self, analyst):
        """While a release runs, watch its client: a disconnect cancels the request."""
        handler = next((h for _, h in list(self._live.values()) if h.analyst is analyst),
                       None)
        if handler is None or isinstance(handler.request, ssl.SSLSocket):
            yield
            return
        done = threading.Event()
        thread = threading.Thread(target=_watch, args=(handler.request, done, analyst),
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    # ---------------------------------------------------------------- audit
    def audit(self, user: str, kind: str, sql: str, outcome) -> None:
        """One line per statement: when, who, what, and what it released or why refused."""
        rec = {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
               "user": user, "kind": kind, "sql": sql[:4000]}
        if isinstance(outcome, Failure):
            rec.update(outcome="refused", sqlstate=outcome.sqlstate, message=outcome.message)
        else:
            rec.update(outcome=getattr(outcome, "tag", "ok"))
        with self._audit_lock, open(self.audit_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def _watch(sock, done: threading.Event, analyst) -> None:
    while not done.is_set():
        try:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    analyst.cancel()
                    return
                done.wait(0.05)       # a pipelined message waits its turn
        except (OSError, ValueError):
            analyst.cancel()
            return


@contextlib.contextmanager
def _marker(server):
    """``DB.dpsql-server`` (address and process id) while the server runs: where other
    tools can learn that the file is served and by whom (docs/server.md)."""
    path = served.marker_path(server.db_path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"address": server.address, "pid": os.getpid()}, f)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def serve(db_path: str, users_path: str, **options) -> None:
    """Run the server until interrupted."""
    def stop(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)        # systemd's stop: finish like Ctrl-C
    with Server(db_path, users_path, **options) as server, _marker(server):
        print(f"dpsql serving {db_path} on {server.address} (users: {users_path}; at most "
              f"{server.max_connections} connections)", flush=True)
        try:
            server.serve_forever(poll_interval=0.2)
        except (KeyboardInterrupt, SystemExit):
            pass
