"""One analyst's connection: statements in, outcomes out, through the DB-API driver.

Every release goes through :class:`dpsql.dbapi.Cursor` (one ``execute`` = one workload =
one charge; the driver's settings are this connection's ``SET dpsql.*`` values, parsed by
the one declaration, :data:`dpsql.request.declared.SETTINGS`). Around it the server adds what an
account needs: the table must be granted, the analyst's allowance is reserved in the
journal before the release and settled after it, the result tables become the analyst's
own. Everything else (catalog, own results, budget) is answered by the shadow catalog,
which holds no protected row.

Result tables live in the analyst's own namespace (:mod:`dpsql.interfaces.server.names`:
``CREATE TABLE t`` writes ``"@alice/t"``), so no analyst can overwrite another's tables or
learn their names. Reuse (answers from past releases) draws only on the releases charged
to this analyst (the Session's ``reuse_scope``). d_X (metric) releases are charged to the
analyst's metric allowance.

Workload markers are the DB-API's (:mod:`dpsql.sql.marker`): ``BEGIN WORKLOAD``, the
statements of a block, ``COMMIT`` and ``ROLLBACK`` go to the DB-API cursor, so the block is
the DB-API connection's (each statement checked before it is collected, one release at
``COMMIT``, nested blocks refused with 25000, plain ``BEGIN``/``COMMIT`` no-ops with a
notice). The server only adds the wire's transaction status: ``T`` while a workload block
or a driver's ``BEGIN`` is open.
"""

from __future__ import annotations

import functools
import traceback
from fractions import Fraction

from dpsql import errors as dp
from dpsql.interfaces import dbapi
from dpsql.interfaces.server import admin, names
from dpsql.interfaces.server import statements as st
from dpsql.interfaces.server.accounts import Account
from dpsql.interfaces.server.catalog import PublicViews
from dpsql.interfaces.server.journal import ZERO, Spend
from dpsql.interfaces.server.results import Failure, Notice, Result
from dpsql.interfaces.server.shadow import Shadow
from dpsql.release.support import InterruptedAfterRelease
from dpsql.request.declared import SETTINGS, settings_for
from dpsql.sql import bigquery
from dpsql.sql import marker

#: the command tag of each marker (PostgreSQL's)
_TAGS = {marker.BEGIN_WORKLOAD: "BEGIN", marker.BEGIN: "BEGIN", marker.COMMIT: "COMMIT",
         marker.ROLLBACK: "ROLLBACK"}

#: the settings a connection can SET (those the DB-API driver takes)
WIRE_SETTINGS = {s.name: s for s in settings_for("dbapi")}


class AnalystConnection:
    """The server side of one client connection (one DB-API connection, one Session)."""

    def __init__(self, server, account: Account, options: dict | None = None):
        self.server = server
        self.account = account
        self.settings = {s.name: s.default for s in WIRE_SETTINGS.values()}
        self.driver_transaction = False    # a driver's BEGIN: only the status byte ('T')
        self.cancelled = self.running = False
        self._dbapi = dbapi.connect(server.db_path, delta=0, epsilon=1, create=False,
                                    spark=server.spark, **server.connection_settings)
        if not account.admin:     # answers from past releases: only those this analyst paid
            self._dbapi.session.reuse_scope = functools.partial(server.journal.paid_by,
                                                                account.user)
        # own result tables are read from the shadow; a release statement that also names
        # another analyst's result table is refused as before, never saying it exists
        self._dbapi.read_results = False
        self.views = PublicViews(server, account, Shadow(), self._dbapi.session)
        for name, value in (options or {}).items():
            self._set(name, value)

    @property
    def in_transaction(self) -> bool:
        """The ReadyForQuery status is 'T': a workload block is open (the DB-API
        connection's) or a driver sent BEGIN (psycopg and SQLAlchemy expect 'T' after it)."""
        return self.driver_transaction or self._dbapi.workload is not None

    # ---------------------------------------------------------------- one query message
    def run(self, sql: str) -> list:
        """Outcomes (Result / Failure / Notice) of a simple query message; a failure ends
        it. The statements that read protected tables outside a block form ONE workload
        (one release); inside a block each is collected."""
        out: list = []
        pending: list[str] = []
        self.views.refresh_shared()      # a share given or taken back meanwhile
        for text in st.split(sql) or [""]:
            k = st.kind(text, self.views.protected(), self.views.visible())
            if k == "release" and not self.in_block:
                pending.append(text)
                continue
            if pending:
                out += self._with_notices(self._release(pending))
                pending = []
                if isinstance(out[-1], Failure):
                    return out
            out += self._with_notices([self.statement(text, k)])
            if isinstance(out[-1], Failure):
                return out
        if pending:
            out += self._with_notices(self._release(pending))
        return out

    @property
    def in_block(self) -> bool:
        return self._dbapi.workload is not None

    def _with_notices(self, outcomes: list) -> list:
        """The DB-API connection's new notices, then ``outcomes``."""
        notices, self._dbapi.notices[:] = list(self._dbapi.notices), []
        return [Notice(self._own(n)) for n in notices] + outcomes

    def _own(self, text: str) -> str:
        """A message as the analyst reads it: their tables under their own names."""
        return names.unprefixed(self.account.user, text)

    def _refusal(self, exc: BaseException) -> Failure:
        failure = _refusal(exc)
        return Failure(failure.sqlstate, self._own(failure.message))

    def statement(self, text: str, k: str):
        """One statement's outcome (a release statement inside a workload block is held)."""
        try:
            outcome = self._dispatch(text, k)
        except (Exception, dp.RequestCancelled) as exc:
            outcome = self._refusal(exc)
        self.server.audit(self.account.user, k, text, outcome)
        return outcome

    def _dispatch(self, text: str, k: str):
        if k == "empty":
            return Result("EMPTY")
        if k == "marker":
            return self._marker(st.marker_of(text))
        if k == "release":      # inside a block (outside, run() makes them one release)
            return self._collect(self._rewrite(text))
        if k == "set":
            return self._set_statement(text)
        if k == "show":
            return self.views.show(st.show_target(text), self.settings)
        if k == "explain":
            return self._explain(text.split(None, 1)[1] if len(text.split(None, 1)) > 1
                                 else "")
        if k == "noop":
            return Result(st.first_word(text))
        if k == "admin":
            return admin.call(self, text)
        if k == "unsupported":
            raise dp.UnsupportedQueryError(
                f"{st.first_word(text) or 'this statement'} is not supported by the dpsql "
                "server: it answers SELECT COUNT batches (releases), EXPLAIN, SET/SHOW "
                "dpsql.*, reads of your result tables and the catalog")
        if k == "denied":        # never says whether it exists (another analyst's results)
            raise dp.UnknownTableError(
                f"relation {st.denied_name(text, self.views.visible())!r} does not exist or "
                "is not yours: you can read protected tables only through a release, and "
                "your own result tables, dpsql_budget and the catalog")
        return self.views.query(text)

    # ---------------------------------------------------------------- workload markers
    def _marker(self, which: str):
        """One marker through the DB-API cursor (its canonical spelling: the DB-API's
        behaviour, whatever the client wrote); COMMIT of a non-empty block is a release."""
        if which in (marker.COMMIT, marker.ROLLBACK):
            self.driver_transaction = False
        if which == marker.COMMIT and self._dbapi.workload:
            return self._commit()
        self._dbapi.cursor().execute(which.upper())    # "BEGIN WORKLOAD", "ROLLBACK", ...
        if which == marker.BEGIN:
            self.driver_transaction = True
        return Result(_TAGS[which])

    def _commit(self):
        """Release the block as ONE workload: its allowance reserved first, then the DB-API
        cursor's COMMIT. Refused (not granted, over the allowance, a setting missing): the
        block is discarded, nothing charged, as a refused COMMIT in the DB-API."""
        outcomes = self._release(list(self._dbapi.workload), execute="COMMIT")
        if self.in_block:
            self._dbapi.cursor().execute("ROLLBACK")
        if isinstance(outcomes[-1], Failure):
            return outcomes[-1]
        return _Many(outcomes + [Result("COMMIT")])

    def _collect(self, text: str):
        """A statement inside the block: granted, then checked and collected by the DB-API
        cursor (refused: an error, and the block stays open as it was)."""
        conn = self._configured()
        try:
            table = conn.session._parse(text, conn.session.policies())[0].table
        except dp.DpsqlError:
            table = None              # refused below by the DB-API, which says so
        if table is not None:
            self._granted(table, "; the statement was not added to the open workload block")
        conn.cursor().execute(text)
        return Result("SELECT 0")

    # ---------------------------------------------------------------- settings
    def _set_statement(self, text: str):
        target = st.set_target(text)
        if target is None and "dpsql." not in text.lower():
            return Result("SET")    # SET TIME ZONE ..., SET SESSION CHARACTERISTICS ...
        if target is None:
            raise dp.ParseError("SET needs a name and a value: SET dpsql.epsilon = 0.1")
        name, value = target
        if name.startswith("dpsql."):
            self._set(name[len("dpsql."):], value)
        return Result("SET")        # other SETs (drivers' datestyle, ...) are accepted

    def _set(self, name: str, value: str) -> None:
        if name not in WIRE_SETTINGS:
            known = ", ".join(f"dpsql.{n}" for n in WIRE_SETTINGS)
            raise dp.PrivacyParameterError(f"unknown setting dpsql.{name}; settings are {known}")
        self.settings[name] = SETTINGS[name].parse(value, "script")

    # ---------------------------------------------------------------- releases
    def _configured(self) -> dbapi.Connection:
        if self.settings["delta"] is None:
            raise dp.PrivacyParameterError("dpsql.delta is not set; every release states its "
                                           "cost: SET dpsql.delta = 1e-6 (0 asks for pure "
                                           "epsilon-DP)")
        if all(self.settings[n] is None for n in ("epsilon", "target_rmse", "max_stderr")):
            raise dp.PrivacyParameterError("dpsql.epsilon is not set: SET dpsql.epsilon = 0.1 "
                                           "(or ask by accuracy: SET dpsql.target_rmse = 50)")
        self._dbapi.configure(**self.settings)
        return self._dbapi

    def _rewrite(self, text: str) -> str:
        """The statement with its result table in this analyst's namespace."""
        return names.rewrite(text, self.account.user, self.views.protected())

    def _explain(self, sql: str):
        conn = self._configured()
        explanation = conn.cursor().explain(self._rewrite(sql))
        self._granted(explanation.table)
        lines = self._own(str(explanation)).splitlines()
        return Result.table(["QUERY PLAN"], ["VARCHAR"], [[ln] for ln in lines], "EXPLAIN")

    def _granted(self, table: str, note: str = "") -> None:
        if not self.account.may_use(table):
            raise dp.AccessDenied(f"table {table!r} is not granted to {self.account.user!r}; "
                                  f"the data owner gives an allowance in the users file{note}")

    def _cost(self, conn, sql: str) -> tuple[str, Spend]:
        """(table, cost) the release may charge: the settings' ε and δ, an accuracy
        target's ε, or (d_X) the metric ε per unit distance; its result tables checked to be
        in this analyst's namespace."""
        policy, queries = conn.session._parse(sql, conn.session.policies())
        self._granted(policy.table)
        names.check_targets(self.account.user, queries)
        asked = self._asked(sql)
        eps = asked["epsilon"]
        if eps is None:                  # an accuracy target: the epsilon it will spend
            eps = conn.cursor().explain(sql).epsilon
        eps = Fraction(repr(eps)) if isinstance(eps, float) else Fraction(eps)
        if asked["model"] == "metric":     # the table's d_X budget only
            return policy.table, Spend(metric=eps)
        return policy.table, Spend(eps, Fraction(asked["delta"]))

    def _asked(self, sql: str) -> dict:
        """This connection's settings with the statement's ``WITH DIFFERENTIAL_PRIVACY
        OPTIONS (...)`` in their place: the DB-API cursor releases with those (they win over
        a connection's settings), so the allowance is reserved for what will be charged."""
        asked = dict(self.settings)
        for _, name, raw, *_ in bigquery.options(sql):
            if name in WIRE_SETTINGS:
                asked[name] = SETTINGS[name].parse(raw, "script")
        return asked

    def _release(self, texts: list[str], execute: str | None = None) -> list:
        """Release ``texts`` as one workload (``execute``: what the DB-API cursor runs for
        it, "COMMIT" for an open block; by default the texts)."""
        sql = ";\n".join(t.strip().rstrip(";").strip() for t in texts)
        try:
            if execute is None:          # the client's texts: result tables in its namespace
                sql = ";\n".join(self._rewrite(t).strip().rstrip(";").strip() for t in texts)
            return self._charged(sql, execute or sql)
        except (Exception, dp.RequestCancelled) as exc:
            outcome = self._refusal(exc)
        self.server.audit(self.account.user, "release", sql, outcome)
        return [outcome]

    def _charged(self, sql: str, execute: str) -> list:
        self.cancelled, self.running = False, True
        try:
            return self._spend(sql, execute)
        finally:
            self.running = self.cancelled = False

    def _spend(self, sql: str, execute: str) -> list:
        conn = self._configured()
        table, cost = self._cost(conn, sql)
        journal = self.server.journal
        rid = journal.reserve(self.account, table, cost)
        cur = conn.cursor()
        try:
            if self.cancelled:
                raise dp.RequestCancelled("the request was cancelled before the charge; "
                                          "nothing was charged or released")
            with self.server.watch(self):
                cur.execute(execute)
            release = cur.release
        except InterruptedAfterRelease as exc:       # charged and written: keep it
            release = exc.release
        except (dp.DpsqlError, dp.RequestCancelled, dbapi.Error):
            journal.settle(rid, self.account, table)      # refused or cancelled: nothing charged
            raise
        except BaseException:
            journal.settle(rid, self.account, table, cost)   # unknown: count it spent
            raise
        free = release.reused or (release.epsilon == 0 and cost.metric == 0)
        journal.settle(rid, self.account, table, ZERO if free else cost,
                       release.release_id, release.tables)
        outcomes = [self.views.add_result(t) for t in release.results]
        self.server.audit(self.account.user, "release", sql,
                          Result(f"released {release.release_id}: {', '.join(release.tables)}"))
        return outcomes

    def cancel(self) -> None:
        """CancelRequest or a disconnect: stop the running request if it has not been
        charged (a cancel with no request running does nothing, as in PostgreSQL)."""
        if not self.running:
            return
        self.cancelled = True
        stop = getattr(self._dbapi, "cancel", None)   # DB-API Connection.cancel(), if present
        if callable(stop):
            stop()

    def close(self) -> None:
        self.views.close()
        try:
            if self.in_block:     # a disconnect discards the block: nothing charged
                self._dbapi.cursor().execute("ROLLBACK")
            self._dbapi.close()
        except dbapi.Error:
            pass


class _Many(list):
    """Several outcomes from one statement (COMMIT of a workload: its result sets)."""


def _refusal(exc: BaseException) -> Failure:
    """What a statement that raised ``exc`` sends: a dpsql error or a cancel (57014, nothing
    charged) with its row of the error table; a DB-API error with the row of the dpsql error
    behind it; anything else is a bug: XX000, its text withheld from the client."""
    if isinstance(exc, dbapi.Error):
        return _failure(exc)
    if not isinstance(exc, (dp.DpsqlError, dp.RequestCancelled)):
        traceback.print_exc()
    return Failure.of(exc)


def _failure(exc: dbapi.Error) -> Failure:
    """The error table's SQLSTATE of the dpsql error behind ``exc``, with the DB-API's
    message (which may say more: "the statement was not added to the open workload block")."""
    cause = exc.__cause__
    if isinstance(cause, (dp.DpsqlError, dp.RequestCancelled)):   # cancelled: 57014
        return Failure(dp.error_row(cause).sqlstate, " ".join(str(exc).split()))
    return Failure(dp.error_row(dp.DpsqlError).sqlstate, str(exc).splitlines()[0])
