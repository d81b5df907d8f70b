"""One analyst's connection: statements in, outcomes out, through the DB-API driver.

Every release goes through :class:`dpsql.dbapi.Cursor` (one ``execute`` = one workload =
one charge; the driver's settings are this connection's ``SET dpsql.*`` values, parsed by
the one declaration, :data:`dpsql.request.SETTINGS`). Around it the server adds what an
account needs: the table must be granted, the analyst's allowance is reserved in the
journal before the release and settled after it, the result tables become the analyst's
own. Everything else (catalog, own results, budget) is answered by the shadow catalog,
which holds no protected row.
"""

from __future__ import annotations

import traceback
from fractions import Fraction

from dpsql import errors as dp
from dpsql.interfaces import dbapi
from dpsql.interfaces.server import admin
from dpsql.interfaces.server import statements as st
from dpsql.interfaces.server.accounts import Account
from dpsql.interfaces.server.catalog import PublicViews
from dpsql.interfaces.server.results import Failure, Result
from dpsql.interfaces.server.shadow import Shadow
from dpsql.release.support import InterruptedAfterRelease
from dpsql.request import SETTINGS, settings_for

#: the settings a connection can SET (those the DB-API driver takes)
WIRE_SETTINGS = {s.name: s for s in settings_for("dbapi")}


class AnalystConnection:
    """The server side of one client connection (one DB-API connection, one Session)."""

    def __init__(self, server, account: Account, options: dict | None = None):
        self.server = server
        self.account = account
        self.settings = {s.name: s.default for s in WIRE_SETTINGS.values()}
        if not account.admin:
            self.settings["reuse"] = False     # reuse would pool other analysts' releases
        self.workload: list[str] | None = None
        self.in_transaction = False
        self.cancelled = self.running = False
        self._dbapi = dbapi.connect(server.db_path, delta=0, epsilon=1, create=False,
                                    lock_timeout=server.lock_timeout)
        self.views = PublicViews(server, account, Shadow(), self._dbapi.session)
        for name, value in (options or {}).items():
            self._set(name, value)

    # ---------------------------------------------------------------- one query message
    def run(self, sql: str) -> list:
        """Outcomes (Result / Failure) of a simple query message; a failure ends it. The
        statements that read protected tables form ONE workload (one release)."""
        out: list = []
        pending: list[str] = []
        for text in st.split(sql) or [""]:
            k = st.kind(text, self.views.protected(), self.views.visible())
            if k == "release" and self.workload is None:
                pending.append(text)
                continue
            if pending:
                out += self._release(pending)
                pending = []
                if isinstance(out[-1], Failure):
                    return out
            out.append(self.statement(text, k))
            if isinstance(out[-1], Failure):
                return out
        if pending:
            out += self._release(pending)
        return out

    def statement(self, text: str, k: str):
        """One statement's outcome (a release statement inside a workload block is held)."""
        try:
            outcome = self._dispatch(text, k)
        except (dp.DpsqlError, dp.RequestCancelled) as exc:   # cancelled: 57014, nothing charged
            outcome = Failure.of(exc)
        except dbapi.Error as exc:
            outcome = _failure(exc)
        except Exception as exc:             # a bug: XX000, its text withheld from the client
            traceback.print_exc()
            outcome = Failure.of(exc)
        self.server.audit(self.account.user, k, text, outcome)
        return outcome

    def _dispatch(self, text: str, k: str):
        if k == "empty":
            return Result("EMPTY")
        if k in ("begin", "begin_workload"):
            if k == "begin_workload":
                if self.workload is not None:
                    raise dp.DpsqlError("a workload block is already open; COMMIT or "
                                        "ROLLBACK it first")
                self.workload = []
            self.in_transaction = True
            return Result("BEGIN")
        if k in ("commit", "rollback"):
            return self._end(k)
        if k == "release":
            self.workload.append(text)
            return Result("SELECT 0")
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

    def _end(self, k: str):
        block, self.workload = self.workload, None
        self.in_transaction = False
        tag = "COMMIT" if k == "commit" else "ROLLBACK"
        if k == "commit" and block:
            outcomes = self._release(block)
            if isinstance(outcomes[-1], Failure):
                return outcomes[-1]
            return _Many(outcomes + [Result(tag)])
        return Result(tag)

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
        parsed = SETTINGS[name].parse(value, "script")
        if name == "reuse" and parsed and not self.account.admin:
            raise dp.AccessDenied("dpsql.reuse is off on the server: past releases are "
                                  "shared by every analyst, so answers from them are not "
                                  "yours to read")
        self.settings[name] = parsed

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

    def _explain(self, sql: str):
        conn = self._configured()
        explanation = conn.cursor().explain(sql)
        self._granted(explanation.table)
        lines = str(explanation).splitlines()
        return Result.table(["QUERY PLAN"], ["VARCHAR"], [[ln] for ln in lines], "EXPLAIN")

    def _granted(self, table: str) -> None:
        if not self.account.may_use(table):
            raise dp.AccessDenied(f"table {table!r} is not granted to {self.account.user!r}; "
                                  "the data owner gives an allowance in the users file")

    def _cost(self, conn, sql: str) -> tuple[str, Fraction, Fraction]:
        """(table, ε, δ) the release may charge: the settings, or an accuracy target's ε."""
        policy, _ = conn.session._parse(sql, conn.session.policies())
        self._granted(policy.table)
        if self.settings["model"] == "metric" and not self.account.admin:
            raise dp.AccessDenied("metric (d_X) releases are charged to the table's metric "
                                  "budget, which has no per-analyst allowance yet: ask the "
                                  "data owner")
        eps = self.settings["epsilon"]
        if eps is None:                  # an accuracy target: the epsilon it will spend
            eps = conn.cursor().explain(sql).epsilon
        eps = Fraction(repr(eps)) if isinstance(eps, float) else Fraction(eps)
        return policy.table, eps, Fraction(self.settings["delta"])

    def _release(self, texts: list[str]) -> list:
        sql = ";\n".join(t.strip().rstrip(";").strip() for t in texts)
        try:
            return self._charged(sql)
        except (dp.DpsqlError, dp.RequestCancelled) as exc:   # cancelled: 57014, nothing charged
            outcome = Failure.of(exc)
        except dbapi.Error as exc:
            outcome = _failure(exc)
        except Exception as exc:             # a bug: XX000, its text withheld from the client
            traceback.print_exc()
            outcome = Failure.of(exc)
        self.server.audit(self.account.user, "release", sql, outcome)
        return [outcome]

    def _charged(self, sql: str) -> list:
        self.cancelled, self.running = False, True
        try:
            return self._spend(sql)
        finally:
            self.running = self.cancelled = False

    def _spend(self, sql: str) -> list:
        conn = self._configured()
        table, eps, dlt = self._cost(conn, sql)
        journal = self.server.journal
        rid = journal.reserve(self.account, table, eps, dlt)
        cur = conn.cursor()
        try:
            if self.cancelled:
                raise dp.RequestCancelled("the request was cancelled before the charge; "
                                          "nothing was charged or released")
            with self.server.watch(self):
                cur.execute(sql)
            release = cur.release
        except InterruptedAfterRelease as exc:       # charged and written: keep it
            release = exc.release
        except (dp.DpsqlError, dp.RequestCancelled, dbapi.Error):
            journal.settle(rid, self.account, table)      # refused or cancelled: nothing charged
            raise
        except BaseException:
            journal.settle(rid, self.account, table, eps, dlt)   # unknown: count it spent
            raise
        free = release.reused or release.epsilon == 0
        journal.settle(rid, self.account, table, 0 if free else eps, 0 if free else dlt,
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
            self._dbapi.close()
        except dbapi.Error:
            pass


class _Many(list):
    """Several outcomes from one statement (COMMIT of a workload: its result sets)."""


def _failure(exc: dbapi.Error) -> Failure:
    cause = exc.__cause__
    if isinstance(cause, dp.DpsqlError):
        return Failure.of(cause)
    return Failure(dp.error_row(dp.DpsqlError).sqlstate, str(exc).splitlines()[0])
