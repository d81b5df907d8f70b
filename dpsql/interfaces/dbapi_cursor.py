"""The DB-API cursor (:mod:`dpsql.interfaces.dbapi`): executes dpsql batches, each one
charged release (workload markers walked through :mod:`dpsql.sql.marker`), and walks their
result sets, one per statement."""

from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

from dpsql import errors as dp
from dpsql.interfaces.dbapi_binding import _Template
from dpsql.interfaces.dbapi_errors import (Error, ProgrammingError, _backend, check_closed,
                                          error_class)
from dpsql.interfaces.dbapi_types import _ANSWER_COLUMNS, _type_code
from dpsql.request.declared import settings_for
from dpsql.request.value import yield_to_options
from dpsql.session import InterruptedAfterRelease
from dpsql.sql.marker import has_marker, walk

#: settings :meth:`Session.explain` takes (the others only matter when spending)
_EXPLAIN_SETTINGS = tuple(s.name for s in settings_for("dbapi") if s.explain)


class Cursor:
    """Executes dpsql batches and walks their result sets (one per statement)."""

    def __init__(self, connection):     # a dbapi.Connection
        self.connection = connection
        self.arraysize = 1
        self.lastrowid = None
        self.release = None               # the last dpsql Release, or None
        self._closed = False
        self._sets: list | None = None    # ResultTable per statement of the last release
        self._set = 0
        self._row = 0
        self._empty = "no result set: call execute() or executemany() first"

    @property
    def closed(self) -> bool:
        return self._closed or self.connection.closed

    # ---------------------------------------------------------------- executing
    @check_closed
    def execute(self, operation: str, parameters: Sequence | None = None) -> "Cursor":
        """Answer ``operation`` (one or more statements) as one charged release."""
        self._reset()
        with self._cancellable():
            return self._run(_Template(operation).bind(parameters))

    @check_closed
    def executemany(self, operation: str, seq_of_parameters) -> "Cursor":
        """Bind every parameter set and answer all statements as ONE workload (one charge).

        Result sets come in order: the statements of the first parameter set, then the
        second, ... (``nextset()`` moves between them). No parameter sets: nothing runs.
        """
        self._reset()
        with self._cancellable():
            template = _Template(operation)
            if isinstance(seq_of_parameters, (str, bytes)) or not isinstance(
                    seq_of_parameters, Iterable):
                raise ProgrammingError("seq_of_parameters must be a sequence of sequences")
            texts: list[str] = []
            for parameters in seq_of_parameters:
                bound = template.bind(parameters)
                texts.extend([bound] if isinstance(bound, str) else bound)
            if not texts:
                return self
            return self._run(texts)

    @contextlib.contextmanager
    def _cancellable(self):
        """The whole execute is cancellable (:meth:`Connection.cancel`), reading its text
        (parameters, markers, result-table reads) included; a cancel is an
        :class:`OperationalError`, as during the request."""
        with _backend(), self.connection._session.cancellable():
            yield

    @check_closed
    def explain(self, operation: str | None = None, parameters: Sequence | None = None):
        """Expected accuracy under the connection's settings: reads no data, charges nothing.
        With an accuracy target, the explanation is at the smallest ε meeting it (its
        ``epsilon`` is what an execute with ``confirm=True`` would spend). Without an
        operation: the open workload block (what its ``COMMIT`` would release)."""
        if operation is None:
            sql = list(self.connection.workload or ())
            if not sql:
                raise ProgrammingError("explain() without SQL explains the open workload "
                                       "block, and none is open (or it is empty); pass SQL, "
                                       "or execute BEGIN WORKLOAD and some statements first")
            return self._explain(sql)
        with self._cancellable():
            return self._explain(_Template(operation).bind(parameters))

    def _explain(self, sql, block=None):
        """``Session.explain`` of ``sql`` under the connection's settings (``block``: its
        ``check`` only, against the block's policies: parsed and compiled, no strategy
        selected)."""
        settings = {k: v for k, v in self.connection._snapshot().items()
                    if k in _EXPLAIN_SETTINGS}
        session = self.connection._session
        with _backend(), self.connection._planning():
            if block is None:
                return session.explain(sql, **settings)
            return session.check(sql, block=block, **settings)

    def _run(self, sql: str | list[str]) -> "Cursor":
        """Answer ``sql``, walking its workload markers (:func:`dpsql.sql.marker.walk`) when
        it has any or a block is open: queries inside a block are checked (the block so far
        parsed and compiled: ``Session.check``) and collected; ``COMMIT`` releases the block
        as one workload. The result sets of every release this execute made are loaded, in
        order."""
        conn = self.connection
        texts = [sql] if isinstance(sql, str) else sql
        with conn._block_lock:
            if not conn._block.is_open and not any(has_marker(t) for t in texts):
                self._answer(sql)
                return self
            try:
                for step in walk(sql, conn._block):
                    if step.kind == "collect":
                        self._collect(step.text)
                    elif step.kind == "notice":
                        conn.notices.append(step.text)
                    else:
                        self._answer(step.text if step.kind == "answer" else
                                     list(step.statements))
            except dp.WorkloadBlockError as exc:
                raise error_class(exc)(str(exc)) from exc
        if self._sets is None and conn._block.is_open:
            self._empty = (f"the statement was added to the open workload block "
                           f"({conn._block.describe()}); COMMIT releases them as one workload")
        return self

    def _collect(self, text: str) -> None:
        """Add one statement to the open block once the block with it parses and compiles
        (``Session.check``: a refused statement is not added; the block stays open as it
        was). Explaining the block at every statement, as this did, made a block of n
        statements cost n strategy selections: 600 through psql did not end in 10 min."""
        block = self.connection._block
        try:
            self._explain([*block.statements, text], block)
        except Error as exc:
            raise type(exc)(f"{exc}; the statement was not added to the open workload "
                            f"block ({block.describe()}): fix it and execute it again, or "
                            "ROLLBACK to discard the block") from exc.__cause__
        block.add(text)

    def _answer(self, sql: str | list[str]) -> None:
        parts = None
        if self.connection.read_results:   # reading result tables back: free, no release
            with _backend():             # a schema probe (SELECT * FROM t WHERE 1=0): the
                probed = self.connection._session.probe(sql)    # declared columns, no row
            if probed is not None:
                self._sets = (self._sets or []) + [probed]
                return
            with _backend():
                parts = self.connection._session.read_plan(sql)
        for kind, texts in parts or [("answer", sql)]:
            if kind == "read":
                self._read(texts[0])
            else:
                self._release(texts)

    def _read(self, text: str) -> None:
        with _backend():
            table = self.connection._session.read_results(text)
        if table is None:         # no longer a result table: the release path says why
            return self._release(text)
        self._sets = (self._sets or []) + [table]

    def _release(self, sql: str | list[str]) -> None:
        settings = yield_to_options(self.connection._snapshot(), sql)   # OPTIONS (...) win
        try:
            with _backend(), self.connection._planning():
                release = self.connection._session.answer(sql, **settings)
        except InterruptedAfterRelease as exc:  # charged and written: keep the answers
            self._load(exc.release)
            raise
        self._load(release)

    def _load(self, release) -> None:
        """Add a release's result sets (several releases of one execute: all, in order)."""
        self.release = release
        self._sets = (self._sets or []) + list(release.results)

    def _reset(self) -> None:
        self._sets, self._set, self._row = None, 0, 0   # a failed execute leaves no results
        self._empty = "no result set: call execute() or executemany() first"

    def _current(self):
        if self._sets is None:
            raise ProgrammingError(self._empty)
        return self._sets[self._set]

    # ---------------------------------------------------------------- results
    @property
    def description(self):
        """(name, type_code, None, None, None, None, None) per column; None before execute."""
        if self._sets is None:
            return None
        table = self._sets[self._set]
        if table.types:           # a result table read back: its DuckDB types
            return tuple((n, t, None, None, None, None, None)
                         for n, t in zip(table.columns, table.types))
        first_answer = len(table.columns) - _ANSWER_COLUMNS
        return tuple((name, "DOUBLE" if i >= first_answer else
                      _type_code(row[i] for row in table.rows), None, None, None, None, None)
                      for i, name in enumerate(table.columns))

    @property
    def rowcount(self) -> int:
        """Rows of the current result set; -1 before any execute."""
        return -1 if self._sets is None else len(self._sets[self._set].rows)

    @check_closed
    def fetchone(self) -> tuple | None:
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    @check_closed
    def fetchmany(self, size: int | None = None) -> list[tuple]:
        size = self.arraysize if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError("fetchmany size must be a non-negative int")
        rows = self._current().rows[self._row:self._row + size]
        self._row += len(rows)
        return [tuple(r) for r in rows]

    @check_closed
    def fetchall(self) -> list[tuple]:
        return self.fetchmany(len(self._current().rows))

    @check_closed
    def nextset(self) -> bool | None:
        """Move to the next statement's result set: True, or None when there is none."""
        self._current()
        if self._set + 1 >= len(self._sets):
            return None
        self._set, self._row = self._set + 1, 0
        return True

    def __iter__(self) -> "Cursor":
        return self

    def __next__(self) -> tuple:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    @check_closed
    def setinputsizes(self, sizes) -> None:
        """No-op (PEP 249 allows it)."""

    @check_closed
    def setoutputsize(self, size, column=None) -> None:
        """No-op (PEP 249 allows it)."""

    @check_closed
    def close(self) -> None:
        self._closed = True
        self._reset()

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc) -> None:
        if not self.closed:
            self.close()
