"""The session: a connection to one database, its data owner's and analyst's calls.

``explain`` and ``answer`` validate the request, pick its mechanism and hand it to the one
release path (:mod:`dpsql.release.path`): explain is the plan alone (it never reads data
nor touches the budget); answer runs plan → check result names → check-and-charge →
measure → infer → write, refusing anything invalid before the kernel reads a single row,
so a bad request charges nothing.

Planning holds no lock: it reads policies and caches through a connection that is let go
before every long step, and the database is held (:meth:`Database.connect`) only for
re-validation, check-and-charge, measure and write. :meth:`Session.cancel` (thread-safe)
cancels a request in flight before its charge (:mod:`dpsql.cancel`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Sequence

from dpsql import cancel
from dpsql.errors import PolicyError, UnknownTableError, UsageError, check_database_path
from dpsql.kernel.boundary import Kernel
from dpsql.kernel.data import SparkLink
from dpsql.policy.policy import TablePolicy, load_policy
from dpsql.release import mechanism
from dpsql.release import path as release_path
from dpsql.release.mechanism import Ask, Public
from dpsql.release.support import (InterruptedAfterRelease, _completed_on_interrupt,
                                   request_matches)
from dpsql.sql import probe
from dpsql.sql.compile import Workload
from dpsql.store import database as engine
from dpsql.store import ledger, readback
from dpsql.store.interrupts import interrupts_restored
from dpsql.store.results import Explanation, Release, ResultTable
from dpsql.request.declared import CONNECTION_SETTINGS, SETTINGS
from dpsql.request.value import Request

__all__ = ["InterruptedAfterRelease", "Session", "connect", "request_matches"]


class Session:
    """A dpsql connection to one DuckDB database. Create it with :func:`dpsql.connect`."""

    def __init__(self, path: str = ":memory:", *, lock_timeout: float = 30.0, sampler=None,
                 reuse: bool = True, on_lock_wait=None, spark=None,
                 spark_master: str | None = None, spark_remote: str | None = None):
        """``reuse``: the default of :meth:`answer`'s and :meth:`explain`'s ``reuse``.
        ``on_lock_wait(holder, remaining)``: called about once per second while another
        process holds the database (:class:`dpsql.store.database.Database`).

        Tables whose policy names a Spark source (docs/spark.md) are read through ``spark``
        (a ``SparkSession``, left running at :meth:`close`), or a session dpsql starts on
        first use on ``spark_master`` (``local[2]``, ``spark://host:7077``) or over Spark
        Connect at ``spark_remote`` (``sc://host:15002``) and stops at :meth:`close`."""
        self.reuse = SETTINGS["reuse"].parse(reuse)
        self.spark = _spark_link(spark, spark_master, spark_remote)
        #: None, or a callable giving the release ids answers may be built from (reuse):
        #: the server limits each analyst to the releases charged to them
        self.reuse_scope = None
        self.db = engine.Database(path, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
        self.kernel = Kernel(sampler, spark=self.spark)
        self._own_spark = self.spark is not None and not isinstance(spark, SparkLink)
        self._running: set = set()          # the tokens of requests in flight
        self._running_lock = threading.Lock()

    # ------------------------------------------------------------------ cancellation
    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel this session's requests in flight that are not charged yet; thread-safe,
        returns at once. Each raises :class:`~dpsql.errors.RequestCancelled` within a
        fraction of a second, nothing charged; a request already past its charge completes
        and is written. No effect when nothing runs (it does not cancel the next request).
        The DB-API's ``Connection.cancel()`` and the server (client disconnect) call it."""
        with self._running_lock:
            tokens = list(self._running)
        for token in tokens:
            token.cancel(reason)

    @contextlib.contextmanager
    def cancellable(self):
        """Work for a request before it starts (an interface reading a submission's text:
        its parameters, markers and result-table reads) that :meth:`cancel` stops as it
        stops a request: the token is checked between the text's pieces and statements."""
        token = cancel.Token()
        with self._running_lock:
            self._running.add(token)
        try:
            with cancel.scope(token):
                yield token
        finally:
            with self._running_lock:
                self._running.discard(token)

    @contextlib.contextmanager
    def _request(self):
        """One cancellable request: its token, and a planning connection that is let go
        before every long step (:func:`dpsql.cancel.run`)."""
        with interrupts_restored(), self.cancellable() as token, \
                self.db.planning() as con, cancel.scope(token, con.release):
            yield con

    # ------------------------------------------------------------------ data owner
    def protect(self, table: str, policy, *, replace: bool = False) -> TablePolicy:
        """Declare ``table``'s public domains and budget (TOML path or dict); stored in the DB."""
        if not isinstance(table, str) or not table:
            raise PolicyError("protect() needs the table name as a string")
        tp = load_policy(policy, table)[table.lower()]
        with self.db.connect() as con:
            if tp.source.spark:         # names and types from Spark's catalog, never values
                self.kernel.check_source(con, tp)
                ledger.save_policy(con, tp, replace=replace)
                return tp
            if not engine.table_exists(con, tp.table):
                raise UnknownTableError(f"there is no table {tp.table!r} in the database to "
                                        "protect; load the data first, or check the name")
            present = engine.table_columns(con, tp.table)
            missing = [c for c in tp.column_names + [tp.privacy_unit]
                       if c is not None and c not in present]
            if missing:
                raise PolicyError(
                    f"policy declares column(s) {missing} that table {tp.table!r} does not have "
                    f"(it has {sorted(present)})")
            ledger.save_policy(con, tp, replace=replace)
        return tp

    # ------------------------------------------------------------------ analyst
    def policies(self) -> dict[str, TablePolicy]:
        with self.db.connect() as con:
            return ledger.load_policies(con)

    def explain(self, sql: str | Sequence[str], *, epsilon=None, delta=None,
                strategy: str = "auto",
                calibration: str = "analytic", model: str = "dp", target_rmse=None,
                max_stderr=None, reuse: bool | None = None) -> Explanation:
        """Expected accuracy of a request: reads no data, spends nothing.

        With ``reuse`` (the session's default unless given) the explanation says which
        answers come free from past releases and what every answer's error is once old and
        new measurements combine.

        Accuracy first: give ``target_rmse`` (the batch's expected RMSE) or ``max_stderr``
        (every answer's standard error) instead of ``epsilon``, and the explanation is for
        the smallest ε (at this δ, three significant digits) that meets it."""
        ask = self._planning_ask(sql, epsilon=epsilon, delta=delta, strategy=strategy,
                                 calibration=calibration, model=model,
                                 target_rmse=target_rmse, max_stderr=max_stderr, reuse=reuse)
        with self._request() as con:
            return release_path.explain(self._public(con), ask)

    def check(self, sql: str | Sequence[str], *, epsilon=None, delta=None,
              strategy: str = "auto", calibration: str = "analytic", model: str = "dp",
              target_rmse=None, max_stderr=None, reuse: bool | None = None,
              block=None) -> None:
        """Raise the error the batch would get at parsing and compiling (a workload block's
        check of each statement added: :func:`dpsql.release.path.check`); reads no data,
        spends nothing, selects no strategy. The settings (:meth:`explain`'s) are checked
        as :meth:`explain` checks them. ``block`` (a :class:`~dpsql.sql.marker.WorkloadBlock`
        whose statements ``sql`` extends): checked against the policies read at its first
        check, not by opening the database each time (0.3 s a time on one with many past
        releases)."""
        ask = self._planning_ask(sql, epsilon=epsilon, delta=delta, strategy=strategy,
                                 calibration=calibration, model=model,
                                 target_rmse=target_rmse, max_stderr=max_stderr, reuse=reuse)
        if block is not None:
            if block.policies is None:
                block.policies = self.policies()
            release_path.check(Public(None, block.policies, self.kernel.private), ask)
            return
        with self._request() as con:
            release_path.check(self._public(con), ask)

    def _planning_ask(self, sql, *, reuse: bool | None, **settings) -> Ask:
        """The request :meth:`explain` and :meth:`check` plan (nothing released): its
        settings checked as every request's are, ``reuse`` the session's unless given."""
        return Ask(Request(sql, reuse=self.reuse if reuse is None else reuse, **settings),
                   release=False)

    def answer(self, sql: str | Sequence[str], *, epsilon=None, delta=None,
               strategy: str = "auto",
               calibration: str = "analytic", replace: bool = False,
               name: str | None = None, model: str = "dp", target_rmse=None,
               max_stderr=None, confirm: bool = False, nonnegative: bool = False,
               integer: bool = False, reuse: bool | None = None) -> Release:
        """Release noisy answers to a batch, charging (epsilon, delta) to the table's budget.

        ``name`` makes the release idempotent: asking again under the same name with the same
        SQL and parameters returns the recorded answers (no charge, no fresh noise); anything
        else under a used name is refused.

        ``delta = 0`` asks for pure ε-DP (Laplace noise, or ``strategy="mwem"``).
        ``model="metric"`` asks for a metric (d_X) release: ``epsilon`` is then ε per unit of
        the table's declared record distance, charged to its separate metric budget.

        Accuracy first: ``target_rmse=`` or ``max_stderr=`` instead of ``epsilon`` spends the
        smallest ε that meets the target (see :meth:`explain`), and only with
        ``confirm=True``; without it the cost is reported in the error and nothing is spent.

        Consistency (post-processing, no privacy cost): ``nonnegative=True`` answers from
        the cell estimates of non-negative least squares (on batches compiled to blocks:
        the closest non-negative consistent marginals, :mod:`dpsql.inference.pgm`), ``integer=True`` rounds the
        answers. The standard errors and intervals still describe the unconstrained
        estimate; the result tables' comments say so.

        Every mechanism goes through the one release path (:mod:`dpsql.release.path`).
        """
        ask = Ask(Request(sql, epsilon=epsilon, delta=delta, strategy=strategy,
                          calibration=calibration, model=model, target_rmse=target_rmse,
                          max_stderr=max_stderr, confirm=confirm, nonnegative=nonnegative,
                          integer=integer, reuse=self.reuse if reuse is None else reuse,
                          name=name, replace=replace))
        done: list = []      # the Release, once built (a late Ctrl-C still reports it)
        with _completed_on_interrupt(done), self._request() as con:
            return release_path.answer(self._public(con), self.kernel, ask, self._write, done,
                                       locked=self.db.connect)

    def read_results(self, sql: str) -> ResultTable | None:
        """Rows of a query that reads only result tables (post-processing of released
        numbers: free, no ledger row), run on a shadow holding copies of just those tables;
        None when it names no result table (a release's business); refused when it mixes
        one with a protected table, a table function or an unknown table
        (:mod:`dpsql.store.readback`)."""
        return readback.read(self.db, sql)

    def probe(self, sql: str) -> ResultTable | None:
        """A schema probe of a protected table (``SELECT * FROM t WHERE 1=0``, ``... LIMIT
        0``: :mod:`dpsql.sql.probe`) answered from its declared columns: no row, no data
        read, nothing charged. None for any other query, and for a column not declared."""
        asked = probe.probe(sql) if isinstance(sql, str) else None
        policy = self.policies().get(asked.table) if asked is not None else None
        if policy is None:
            return None
        declared = {c.lower(): c for c in policy.column_names}
        names = [declared.get(c) for c in asked.columns or declared]
        if None in names:
            return None
        return ResultTable(policy.table, tuple(names), [],
                           tuple(engine.key_sql_type(policy.column(c)) for c in names))

    def table_names(self) -> tuple[set, set]:
        """(protected tables, result tables), lower case: how scripts tell their reads of
        result tables from their workloads (:func:`dpsql.sql.script.parse_script`)."""
        return readback.names(self.db)

    def read_plan(self, sql: str | Sequence[str]) -> list | None:
        """A submission without workload markers as ("answer", [statements]) workloads and
        ("read", [statement]) result-table reads, in order; None when it reads no result
        table (answer it as given). The DB-API and the shell run both kinds in order."""
        return readback.plan(self.db, [sql] if isinstance(sql, str) else list(sql))

    def _public(self, con) -> Public:
        scope = None if self.reuse_scope is None else frozenset(self.reuse_scope())
        return Public(con, ledger.load_policies(con), self.kernel.private, scope)

    def _write(self, con, receipt, plan, answers, ask) -> Release:
        """The release path's write step (:func:`dpsql.release.path.publish`): the result
        tables, then the Release returned."""
        return release_path.publish(con, receipt, plan, answers, ask, make=Release)

    def budget(self, table: str | None = None) -> dict:
        """Spent and remaining (ε, δ) per protected table (exact fractions and floats)."""
        with self.db.connect() as con:
            policies = ledger.load_policies(con)
            if table is not None:
                if table.lower() not in policies:
                    raise UnknownTableError(f"table {table!r} is not protected; `dpsql "
                                            "budget DB` lists the protected tables")
                policies = {table.lower(): policies[table.lower()]}
            out = {}
            for name, p in policies.items():
                reading = ledger.total(con, p)
                used = reading.reported(p.budget)
                left = ledger.remaining(p, reading)
                out[name] = {
                    "accounting": reading.method,
                    "epsilon_limit": p.epsilon, "delta_limit": p.delta,
                    "epsilon_spent": used.epsilon, "delta_spent": used.delta,
                    "epsilon_remaining": left.epsilon, "delta_remaining": left.delta,
                    # the two routes of the filter (docs/accounting.md)
                    "zcdp_delta": p.zcdp_delta,
                    "basic_epsilon": reading.basic.epsilon, "basic_delta": reading.basic.delta,
                    "basic_delta_limit": p.budget.basic_delta,
                    "rho_spent": reading.rho, "zcdp_epsilon": reading.zcdp_epsilon,
                }
                if p.metric is not None:
                    used_metric = ledger.spent_metric(con, name)
                    out[name].update({
                        "metric_epsilon_limit": p.metric.epsilon_per_unit,
                        "metric_epsilon_spent": used_metric,
                        "metric_epsilon_remaining": p.metric.epsilon_per_unit - used_metric})
        return out[table.lower()] if table is not None else out

    def ledger(self, table: str | None = None) -> list[dict]:
        with self.db.connect() as con:
            return ledger.entries(con, table.lower() if table else None)

    def close(self) -> None:
        self.db.close()
        if self._own_spark:
            self.spark.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _parse(sql, policies) -> tuple[TablePolicy, list]:
        return mechanism.parse_request(sql, policies)

    @staticmethod
    def _compile(sql, policies) -> tuple[TablePolicy, list, Workload]:
        return mechanism.compile_request(sql, policies)

    def _explain_metric(self, policies, sql, eps, strategy):
        """The explanation of a metric (d_X) request (public only)."""
        ask = Ask(Request(sql, epsilon=eps, delta=0, strategy=strategy, model="metric"),
                  release=False)
        return release_path.explain(Public(None, policies, self.kernel.private), ask)


def _spark_link(spark, master, remote) -> SparkLink | None:
    """The kernel's way to Spark: the caller's session or link, or one to start on first
    use from the (checked) connection settings ``spark_master`` / ``spark_remote``."""
    master = CONNECTION_SETTINGS["spark_master"].parse(master)
    remote = CONNECTION_SETTINGS["spark_remote"].parse(remote)
    given = [name for name, v in (("spark", spark), ("spark_master", master),
                                  ("spark_remote", remote)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are both given; reach Spark one way: a "
                         "session (spark=), a master URL or a Spark Connect URL")
    if spark is not None:
        return spark if isinstance(spark, SparkLink) else SparkLink(spark)
    if master is None and remote is None:
        return None
    return SparkLink(master=master, remote=remote)


def spark_link(master: str | None = None, remote: str | None = None) -> SparkLink | None:
    """A way to Spark that several sessions share (the server's): started on first use,
    stopped by its ``close()``, never by a session's."""
    return _spark_link(None, master, remote)


def connect(path: str = ":memory:", *, create: bool = False, **kwargs) -> Session:
    """Open a dpsql session on a DuckDB database file (the control database: ledger,
    caches, result tables, and the protected tables that live in DuckDB). A path that does
    not exist is refused (a typo would silently become a new, empty database) unless
    ``create=True``; ``:memory:`` is always fine. ``spark=SparkSession`` (or
    ``spark_master=`` / ``spark_remote=``) reaches the tables that live in Spark."""
    check_database_path(os.fspath(path), CONNECTION_SETTINGS["create"].parse(create))
    return Session(path, **kwargs)
