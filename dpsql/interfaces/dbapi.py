"""PEP 249 (DB-API 2.0) driver for dpsql: read-only, and every execute is one charged release.

Each ``execute``/``executemany`` is ONE release (one workload, one ledger charge of the
connection's current epsilon/delta, committed before any number is returned); a refused
request charges nothing. Accuracy first: a connection set with ``target_rmse`` or
``max_stderr`` instead of ``epsilon`` spends the smallest epsilon meeting it, only with
``confirm=True`` (``cursor.explain`` shows that epsilon first). With ``reuse`` (the
default) an execute is answered from past releases wherever they are at least as accurate:
a batch they answer in full is recorded at zero cost. ``BEGIN WORKLOAD`` ... ``COMMIT``
(:mod:`dpsql.sql.marker`) collects several executes into ONE release, charged at the
``COMMIT``; ``ROLLBACK`` discards them. Parameters (qmark) are bound
as literals in sqlglot's syntax tree, never by string formatting. ``threadsafety = 2``:
threads may share the module and connections, not cursors (a Session holds a per-file lock
for each whole request, and a connection's settings are read once per execute under its own
lock). Design, error mapping and compliance: docs/dbapi.md.

This module is the PEP's one namespace (``connect``, :class:`Connection`, the module
globals); the exceptions and :func:`error_class` (:mod:`.dbapi_errors`), the type objects
and constructors (:mod:`.dbapi_types`), the binding (:mod:`.dbapi_binding`) and
:class:`Cursor` (:mod:`.dbapi_cursor`) are written in their own modules and are
attributes of this one.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref

from dpsql import errors as dp
from dpsql.interfaces.dbapi_cursor import Cursor
# the PEP's one module namespace: the exceptions, error_class, type objects and constructors
# are this module's attributes (imported from where they are written)
from dpsql.interfaces.dbapi_errors import (  # noqa: F401
    BudgetExceeded, DatabaseError, DataError, Error, IntegrityError, InterfaceError, InternalError,
    NotSupportedError, OperationalError, ProgrammingError, Warning, _backend, check_closed,
    error_class)
from dpsql.interfaces.dbapi_types import (  # noqa: F401
    BINARY, DATETIME, NUMBER, ROWID, STRING, Binary, Date, DateFromTicks, DBAPITypeObject, Time,
    TimeFromTicks, Timestamp, TimestampFromTicks)
from dpsql.session import Session
from dpsql.sql.marker import WorkloadBlock, notice_discarded
from dpsql.request.declared import CONNECTION_SETTINGS, settings_for
from dpsql.request.value import Request
from dpsql.workload import limits as planning

apilevel = "2.0"
threadsafety = 2
paramstyle = "qmark"


class WorkloadDiscarded(UserWarning):
    """A connection was closed with a workload block open: its statements were discarded
    and nothing was charged (a Python warning category, not a PEP 249 exception)."""


# --------------------------------------------------------------------------- connection

def _validated(settings: dict) -> dict:
    """The settings, checked together as one :class:`~dpsql.request.value.Request` (all or
    nothing; every setting with its declared parser). Numbers are kept as given (a
    connection reads back the 0.1 it was set to); the others as the parser normalised
    them (a strategy spec stripped, a model in lower case)."""
    with _backend():
        request = Request(**{s.keyword: settings[s.name] for s in _SETTINGS})
    return {s.name: settings[s.name] if s.kind == "number" and settings[s.name] is not None
            else getattr(request, s.keyword) for s in _SETTINGS}


#: the settings of a connection's requests (connect keywords, attributes, configure())
_SETTINGS = settings_for("dbapi")


def connect(database, *, spark=None, **settings) -> "Connection":
    """``connect(database, *, epsilon, delta, ...)``: a connection whose every execute
    charges (epsilon, delta) or asks by an accuracy target; change the settings in between
    (attributes or :meth:`Connection.configure`). The keywords are the declared settings
    (:data:`dpsql.request.declared.SETTINGS` exposed to ``dbapi``: epsilon, target_rmse, max_stderr,
    delta, strategy, calibration, model, nonnegative, integer, reuse, confirm) and the
    connection's own (:data:`dpsql.request.declared.CONNECTION_SETTINGS`: lock_timeout, create,
    max_memory, time_limit, spark_master, spark_remote). ``spark=SparkSession`` reads the
    tables whose policy names a Spark source through that session (docs/spark.md).
    ``delta=0`` is pure epsilon-DP; ``model="metric"`` charges epsilon per unit distance
    to the table's metric (d_X) budget. Accuracy first: ``target_rmse`` or ``max_stderr``
    instead of ``epsilon`` (with ``confirm=True`` to spend what it needs)."""
    return Connection(database, spark=spark, **settings)


def _setting(name: str, doc: str) -> property:
    def get(self):
        return self._settings[name]

    @check_closed
    def set_(self, value):
        self.configure(**{name: value})
    return property(get, set_, doc=doc)


def _unknown(settings: dict) -> None:
    unknown = set(settings) - {s.name for s in _SETTINGS}
    if unknown:
        raise ProgrammingError(f"unknown setting(s) {sorted(unknown)}; settings are "
                               f"{sorted(s.name for s in _SETTINGS)}")


class Connection:
    """A DB-API connection: one dpsql Session plus the privacy settings each execute charges."""

    Warning, Error, InterfaceError, DatabaseError = Warning, Error, InterfaceError, DatabaseError
    DataError, OperationalError, IntegrityError = DataError, OperationalError, IntegrityError
    InternalError, ProgrammingError = InternalError, ProgrammingError
    NotSupportedError, BudgetExceeded = NotSupportedError, BudgetExceeded

    def __init__(self, database, *, spark=None, **settings):
        try:
            path = os.fspath(database)
        except TypeError:
            raise ProgrammingError(f"database must be a path, got "
                                   f"{type(database).__name__}") from None
        missing = [s.name for s in _SETTINGS if s.required and s.name not in settings]
        if missing:       # the privacy parameters are never implicit
            raise TypeError(f"connect() missing required keyword argument(s): {missing}")
        own = {s.name: settings.pop(s.name, s.default)
               for s in CONNECTION_SETTINGS.values() if "dbapi" in s.interfaces}
        _unknown(settings)
        self._settings = _validated({s.name: settings.get(s.name, s.default)
                                     for s in _SETTINGS})
        with _backend():
            own = {name: CONNECTION_SETTINGS[name].parse(v) for name, v in own.items()}
            dp.check_database_path(path, own["create"])
        self._lock = threading.Lock()
        self._block = WorkloadBlock()      # BEGIN WORKLOAD ... COMMIT (dpsql.sql.marker)
        self._block_lock = threading.RLock()
        #: notices (one line each, oldest first), as psycopg2's ``connection.notices``: the
        #: no-op BEGIN / COMMIT / ROLLBACK, a discarded or empty workload block
        self.notices: list[str] = []
        self._cursors: weakref.WeakSet = weakref.WeakSet()
        self.closed = False
        #: a SELECT over result tables only is read back (free); the server turns it off
        #: (it reads an analyst's own result tables from its shadow, and must not say whether
        #: another analyst's table exists)
        self.read_results = True
        with _backend():
            self._session = Session(path, lock_timeout=own["lock_timeout"], spark=spark,
                                    spark_master=own["spark_master"],
                                    spark_remote=own["spark_remote"])
        self._limits = {k: own[k] for k in ("max_memory", "time_limit")}

    def _planning(self):
        """Plan this connection's requests within its ``max_memory`` and ``time_limit``."""
        return planning.applied(**self._limits)

    @check_closed
    def configure(self, **changes) -> None:
        """Change several settings at once (validated together; all or nothing), e.g.
        ``configure(epsilon=None, target_rmse=50, confirm=True)`` to ask by accuracy."""
        _unknown(changes)
        with self._lock:
            self._settings = _validated(dict(self._settings, **changes))

    def _snapshot(self) -> dict:
        with self._lock:
            return dict(self._settings)

    @property
    def workload(self) -> tuple | None:
        """The statements collected by an open ``BEGIN WORKLOAD`` block (released as one
        workload at ``COMMIT``), or None when no block is open."""
        with self._block_lock:
            return tuple(self._block.statements) if self._block.is_open else None

    @property
    def session(self) -> Session:
        """The underlying dpsql Session (budget, ledger, data-owner operations)."""
        return self._session

    @check_closed
    def cursor(self) -> "Cursor":
        cur = Cursor(self)
        with self._lock:
            self._cursors.add(cur)
        return cur

    def cancel(self) -> None:
        """Cancel the request this connection is running, from any thread (psycopg's name;
        optional in PEP 249): unless it was already charged, its ``execute`` raises
        :class:`OperationalError` (SQLSTATE 57014) within a fraction of a second and nothing
        is charged; a request past its charge completes. No effect when nothing runs."""
        if not self.closed:
            self._session.cancel("cancelled by Connection.cancel()")

    @check_closed
    def commit(self) -> None:
        """No-op: the ledger commits every release before its answers are returned."""

    @check_closed
    def rollback(self) -> None:
        raise NotSupportedError(
            "rollback is not supported: every release was charged to the privacy ledger and "
            "committed before its answers were returned, and spent budget cannot be given "
            "back (the answers may already have been seen); there is never a pending "
            "transaction to roll back")

    @check_closed
    def close(self) -> None:
        with self._block_lock:
            if self._block.is_open:     # never released implicitly: discarded, with a warning
                message = ("connection closed with a workload block open: "
                           + notice_discarded(len(self._block.close())))
                self.notices.append(message)
                warnings.warn(message, WorkloadDiscarded, stacklevel=2)
        self.closed = True
        with self._lock:
            cursors = list(self._cursors)
        for cur in cursors:
            cur._closed = True
        with _backend():
            self._session.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        if not self.closed:
            self.close()


for _s in _SETTINGS:     # one attribute per declared setting, validated on assignment
    setattr(Connection, _s.name, _setting(_s.name, _s.help))
del _s
