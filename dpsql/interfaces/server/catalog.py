"""What an analyst may see besides releases, kept in the connection's shadow catalog.

Protected tables (declared columns only, no rows), the analyst's own result tables (under
the names they gave: :func:`dpsql.interfaces.server.names.logical`), the tables other
analysts shared with them (``owner.name``, read only; copied again whenever the journal
says a share changed or a shared table was written again), ``dpsql_budget`` (their
allowance of each granted table: spent and remaining ε, δ and metric ε), and for the data
owner ``dpsql_ledger`` (every release, which analyst it was charged to). ``SHOW``
answers settings, the budget and the few driver parameters PostgreSQL clients ask for.
"""

from __future__ import annotations

import json
import os
from fractions import Fraction

import duckdb

from dpsql import errors as dp
from dpsql.interfaces.server import names
from dpsql.interfaces.server.journal import ZERO, Spend
from dpsql.interfaces.server.results import Result
from dpsql.interfaces.server.shadow import SERVER_VERSION
from dpsql.store.shadow import sql_type
from dpsql.store.database import quote_ident
from dpsql.store.ledger import is_result_table

BUDGET_COLUMNS = ("table_name", "epsilon_allowance", "epsilon_spent", "epsilon_remaining",
                  "delta_allowance", "delta_spent", "delta_remaining",
                  "metric_epsilon_allowance", "metric_epsilon_spent",
                  "metric_epsilon_remaining")
BUDGET_TYPES = ["VARCHAR"] + ["DOUBLE"] * 9
#: what PostgreSQL clients ask with SHOW on connect
DRIVER_PARAMETERS = {
    "transaction isolation level": "read committed", "transaction_isolation": "read committed",
    "standard_conforming_strings": "on", "server_version": SERVER_VERSION.split()[0],
    "server_encoding": "UTF8", "client_encoding": "UTF8", "datestyle": "ISO, MDY",
    "timezone": "UTC", "integer_datetimes": "on", "search_path": "main",
    "default_transaction_read_only": "on", "lc_collate": "C", "max_identifier_length": "63",
}


class PublicViews:
    def __init__(self, server, account, shadow, session):
        self.server, self.account, self.shadow, self.session = server, account, shadow, session
        self.policies = session.policies()
        for policy in self.policies.values():
            if account.may_use(policy.table):
                shadow.protected(policy)
        self._seen = None            # the journal's shared_version the copies are of
        self._shared: list = []      # (schema, name) of the shared tables in the shadow
        journal, user = server.journal, account.user
        with session.db.connect() as con:
            for table in journal.owned(user):
                self._copy(con, table, names.logical(user, table))
        self.refresh_shared()
        self.refresh_budget()

    def protected(self) -> set:
        return set(self.policies)

    def visible(self) -> set:
        return self.shadow.tables

    def refresh_shared(self) -> None:
        """Copy the tables shared with the analyst into the shadow (as ``owner.name``) when
        what is shared with them changed since the last copy."""
        journal, user = self.server.journal, self.account.user
        if journal.shared_version(user) == self._seen:
            return
        self._seen = journal.shared_version(user)
        shared = journal.shared_with(user)
        for schema, name in self._shared:
            self.shadow.drop(name, schema)
        self._shared = []
        if not shared:
            return
        with self.session.db.connect() as con:
            for owner, table in shared:
                schema, name = owner, names.logical(owner, table)
                if self._copy(con, table, name, schema):
                    self._shared.append((schema, name))

    def _copy(self, con, table: str, name: str, schema: str | None = None) -> bool:
        if not is_result_table(con, table):
            return False
        cur = con.execute(f"SELECT * FROM {quote_ident(table)}")
        cols = [(d[0], str(d[1])) for d in cur.description]
        self.shadow.table(name, [c for c, _ in cols], cur.fetchall(), [t for _, t in cols],
                          schema=schema)
        return True

    def add_result(self, result_table) -> Result:
        """A release's result table: shown as the statement's rows and kept as own."""
        cols = list(result_table.columns)
        types = [None] * len(cols)
        for i in range(max(0, len(cols) - 4), len(cols)):
            types[i] = "DOUBLE"
        types = [t or sql_type(result_table.rows, i) for i, t in enumerate(types)]
        self.shadow.table(names.logical(self.account.user, result_table.name), cols,
                          result_table.rows, types)
        return Result.table(cols, types, result_table.rows)

    # ---------------------------------------------------------------- budget and ledger
    def budget_rows(self) -> list:
        """Per granted table: allowance, spent, remaining of ε, δ and metric ε (the
        remaining also capped by what is left of the table's budgets; the metric columns
        NULL when the table has no metric budget)."""
        rows = []
        for table, b in sorted(self.session.budget().items()):
            if not self.account.may_use(table):
                continue
            metric = "metric_epsilon_limit" in b
            left = _spend(b, "remaining", metric)
            if self.account.admin:
                allowance, spent = _spend(b, "limit", metric), _spend(b, "spent", metric)
            else:
                allowance = self.account.allowances[table].spend
                spent = self.server.journal.used(self.account.user, table)
            row = [table]
            for i, (have, used, rest) in enumerate(zip(allowance, spent, left)):
                if i == 2 and not metric:
                    row += [None, None, None]
                    continue
                mine = max(Fraction(0), min(have - used, rest))
                row += [float(have), float(used), float(mine)]
            rows.append(row)
        return rows

    def refresh_budget(self) -> None:
        self.shadow.table("dpsql_budget", BUDGET_COLUMNS, self.budget_rows(), BUDGET_TYPES)
        if self.account.admin:
            entries = self.session.ledger()
            users = self.server.journal.releases
            cols = ["release_id", "analyst", "table_name", "epsilon", "delta", "mechanism",
                    "strategy", "status", "sql_text", "result_tables", "metric_epsilon"]
            rows = [[e["release_id"], users.get(int(e["release_id"])), e["table_name"],
                     e["epsilon"], e["delta"], e["mechanism"], e["strategy"], e["status"],
                     e["sql_text"], ", ".join(e["result_tables"] or []),
                     e.get("metric_epsilon")] for e in entries]
            self.shadow.table("dpsql_ledger", cols, rows,
                              ["BIGINT", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE"]
                              + ["VARCHAR"] * 5 + ["DOUBLE"])
            self._audit()

    def _audit(self) -> None:
        """The data owner's view of the audit trail (every statement, who, the outcome)."""
        cols = ["at", "analyst", "kind", "sql_text", "outcome", "sqlstate", "message"]
        rows = []
        if os.path.exists(self.server.audit_path):
            with open(self.server.audit_path, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line)
                    rows.append([r["at"], r["user"], r["kind"], r["sql"], r["outcome"],
                                 r.get("sqlstate"), r.get("message")])
        self.shadow.table("dpsql_audit", cols, rows, ["VARCHAR"] * len(cols))

    # ---------------------------------------------------------------- queries
    def query(self, sql: str) -> Result:
        low = sql.lower()
        if "dpsql_budget" in low or "dpsql_ledger" in low:
            self.refresh_budget()
        if "dpsql_audit" in low and self.account.admin:
            self._audit()
        try:
            columns, rows = self.shadow.run(sql)
        except duckdb.Error as exc:
            # the shadow holds no protected row: its message names catalog objects only
            raise dp.UnsupportedQueryError(
                "this catalog query is not supported by the dpsql server ("
                + str(exc).splitlines()[0][:200] + ")") from None
        if columns is None:
            return Result("OK")
        return Result.table([c for c, _ in columns], [t for _, t in columns], rows)

    def show(self, name: str, settings: dict) -> Result:
        if name in ("dpsql.budget", "dpsql_budget"):
            return Result.table(BUDGET_COLUMNS, BUDGET_TYPES, self.budget_rows(), "SHOW")
        if name.startswith("dpsql."):
            key = name[len("dpsql."):]
            if key not in settings:
                raise dp.PrivacyParameterError(f"unknown setting {name}; SHOW dpsql.budget or "
                                               "a setting such as dpsql.epsilon")
            value = settings[key]
            shown = "" if value is None else str(value).lower() if isinstance(value, bool) \
                else str(value)
            return Result.table([name], ["VARCHAR"], [[shown]], "SHOW")
        if name == "all":
            rows = [[k, v] for k, v in DRIVER_PARAMETERS.items()]
            return Result.table(["name", "setting"], ["VARCHAR", "VARCHAR"], rows, "SHOW")
        value = DRIVER_PARAMETERS.get(name, "")
        return Result.table([name.replace(" ", "_")], ["VARCHAR"], [[value]], "SHOW")

    def close(self) -> None:
        self.shadow.close()


def _spend(budget: dict, which: str, metric: bool) -> Spend:
    """A table's ``limit``, ``spent`` or ``remaining`` (ε, δ, metric ε) from
    :meth:`dpsql.session.Session.budget`."""
    return Spend(Fraction(budget[f"epsilon_{which}"]), Fraction(budget[f"delta_{which}"]),
                 Fraction(budget[f"metric_epsilon_{which}"]) if metric else ZERO.metric)
