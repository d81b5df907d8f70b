"""What an analyst may see besides releases, kept in the connection's shadow catalog.

Protected tables (declared columns only, no rows), the analyst's own result tables,
``dpsql_budget`` (their allowance of each granted table: spent and remaining), and for the
data owner ``dpsql_ledger`` (every release and which analyst it was charged to). ``SHOW``
answers settings, the budget and the few driver parameters PostgreSQL clients ask for.
"""

from __future__ import annotations

import json
import os
from fractions import Fraction

import duckdb

from dpsql import errors as dp
from dpsql.interfaces.server.results import Result
from dpsql.interfaces.server.shadow import SERVER_VERSION
from dpsql.store.shadow import sql_type
from dpsql.store.database import quote_ident
from dpsql.store.ledger import is_result_table

BUDGET_COLUMNS = ("table_name", "epsilon_allowance", "epsilon_spent", "epsilon_remaining",
                  "delta_allowance", "delta_spent", "delta_remaining")
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
        self._load_own_results()
        self.refresh_budget()

    def protected(self) -> set:
        return set(self.policies)

    def visible(self) -> set:
        return self.shadow.tables

    def _load_own_results(self) -> None:
        names = self.server.journal.owned(self.account.user)
        with self.session.db.connect() as con:
            for name in names:
                if not is_result_table(con, name):
                    continue
                cur = con.execute(f"SELECT * FROM {quote_ident(name)}")
                cols = [(d[0], str(d[1])) for d in cur.description]
                self.shadow.table(name, [c for c, _ in cols], cur.fetchall(),
                                  [t for _, t in cols])

    def add_result(self, result_table) -> Result:
        """A release's result table: shown as the statement's rows and kept as own."""
        cols = list(result_table.columns)
        types = [None] * len(cols)
        for i in range(max(0, len(cols) - 4), len(cols)):
            types[i] = "DOUBLE"
        types = [t or sql_type(result_table.rows, i) for i, t in enumerate(types)]
        self.shadow.table(result_table.name, cols, result_table.rows, types)
        return Result.table(cols, types, result_table.rows)

    # ---------------------------------------------------------------- budget and ledger
    def budget_rows(self) -> list:
        rows = []
        budgets = self.session.budget()
        for table, b in sorted(budgets.items()):
            if not self.account.may_use(table):
                continue
            table_left = (Fraction(b["epsilon_remaining"]), Fraction(b["delta_remaining"]))
            if self.account.admin:
                allowance = (Fraction(b["epsilon_limit"]), Fraction(b["delta_limit"]))
                spent = (Fraction(b["epsilon_spent"]), Fraction(b["delta_spent"]))
            else:
                a = self.account.allowances[table]
                allowance = (a.epsilon, a.delta)
                spent = self.server.journal.used(self.account.user, table)
            left = [max(Fraction(0), min(allowance[i] - spent[i], table_left[i]))
                    for i in range(2)]
            rows.append([table, float(allowance[0]), float(spent[0]), float(left[0]),
                         float(allowance[1]), float(spent[1]), float(left[1])])
        return rows

    def refresh_budget(self) -> None:
        self.shadow.table("dpsql_budget", BUDGET_COLUMNS, self.budget_rows(),
                          ["VARCHAR"] + ["DOUBLE"] * 6)
        if self.account.admin:
            entries = self.session.ledger()
            users = self.server.journal.releases
            cols = ["release_id", "analyst", "table_name", "epsilon", "delta", "mechanism",
                    "strategy", "status", "sql_text", "result_tables"]
            rows = [[e["release_id"], users.get(int(e["release_id"])), e["table_name"],
                     e["epsilon"], e["delta"], e["mechanism"], e["strategy"], e["status"],
                     e["sql_text"], ", ".join(e["result_tables"] or [])] for e in entries]
            self.shadow.table("dpsql_ledger", cols, rows,
                              ["BIGINT", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE"]
                              + ["VARCHAR"] * 5)
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
            return Result.table(BUDGET_COLUMNS, ["VARCHAR"] + ["DOUBLE"] * 6,
                                self.budget_rows(), "SHOW")
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
