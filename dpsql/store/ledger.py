"""The persistent privacy ledger, stored in the database's ``dpsql`` schema.

Tables (readable with plain DuckDB; created and migrated by :mod:`dpsql.store.schema`):

- ``dpsql.policies``: one row per protected table, its validated policy as JSON.
- ``dpsql.ledger``: one row per charge. Exact ε and δ as ``num/den`` text (the amounts that
  are summed) beside DOUBLE copies for reading; mechanism, strategy, noise scale, the SQL,
  the result table names, whether the noise came from the secure sampler (``private``), and
  ``status``: ``charged`` when the budget is spent, ``released`` once results are written.
- ``dpsql.release_tables``: result table -> release, with the statement that produced it.

Metric (d_X) releases are charged to the table's separate metric budget: their ε per unit
distance goes to ``metric_epsilon_exact`` and their standard ε and δ are 0, so the two kinds
of budget are never summed together.

Totals: :func:`total` reads the charges with the accountant of :mod:`dpsql.noise.composition` (a
privacy filter with two routes, basic composition and zCDP, each with its own share of the
table's δ; docs/accounting.md); the budget check in :func:`charge` uses the same. Nothing is
ever rewritten: a policy saved before the δ split existed reads as basic composition alone.

Atomicity: :func:`charge` runs inside one transaction on a connection that holds the
database exclusively (see :mod:`dpsql.store.database`), so the budget check and the ledger insert
cannot interleave with another charge, in this process or another. A refused charge writes
nothing.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import duckdb

from dpsql.noise import composition
from dpsql.noise.accounting import PrivacyCost, fraction_from_text, fraction_to_text
from dpsql.store import schema
from dpsql.store.database import engine_errors
from dpsql.errors import BudgetExceededError, PolicyError
from dpsql.policy.policy import TablePolicy

LEDGER_COLUMNS = (
    "release_id, created_at, table_name, epsilon, delta, mechanism, strategy, calibration, "
    "sigma, sensitivity, n_queries, n_cells, expected_rmse, sql_text, result_tables, private, "
    "status, release_name, bound_ratio, metric_epsilon, request, reused_from, epsilon_exact, "
    "delta_exact, metric_epsilon_exact"
)


def ensure_schema(con) -> None:
    """Create dpsql's tables (or migrate them) at the current version: :mod:`dpsql.store.schema`."""
    schema.ensure(con)


def has_schema(con) -> bool:
    """Whether dpsql's tables exist (a cheap probe: the catalog functions are slower)."""
    try:
        con.execute("SELECT 1 FROM dpsql.ledger LIMIT 0")
        con.execute("SELECT 1 FROM dpsql.policies LIMIT 0")
        return True
    except duckdb.CatalogException:
        return False


def save_policy(con, policy: TablePolicy, *, replace: bool = False) -> None:
    ensure_schema(con)
    with engine_errors("saving the policy"):
        existing = con.execute("SELECT policy FROM dpsql.policies WHERE table_name = ?",
                               [policy.table]).fetchone()
        if existing is not None:
            if not replace:
                raise PolicyError(
                    f"table {policy.table!r} is already protected; pass replace=True (`dpsql "
                    "protect --replace`) to change its policy (its ledger is kept and still "
                    "counts against the new budget)")
            if "zcdp_delta" not in json.loads(existing[0]) and spends(con, policy.table):
                # the table's releases were admitted by the rule before the δ split: keep it
                # on basic composition alone, never more budget under its past releases
                policy = dataclasses.replace(policy, zcdp_delta=Fraction(0))
            con.execute("UPDATE dpsql.policies SET policy = ?, data_epoch = "
                        "CAST(uuid() AS VARCHAR), unit_key = ? WHERE table_name = ?",
                        [policy.to_json(), _new_unit_key(policy), policy.table])
        else:
            con.execute("INSERT INTO dpsql.policies (table_name, policy, data_epoch, unit_key) "
                        "VALUES (?, ?, CAST(uuid() AS VARCHAR), ?)",
                        [policy.table, policy.to_json(), _new_unit_key(policy)])


def _new_unit_key(policy: TablePolicy) -> str | None:
    """A fresh 256-bit key for the per-unit row selection of a user-level policy (drawn by
    the operating system's secure generator at every protect), else None. It is stored
    beside the policy, never in its JSON, and read only by the kernel (:func:`unit_key`)."""
    return secrets.token_hex(32) if policy.privacy_unit is not None else None


def unit_key(con, table: str) -> str:
    """The secret key of ``table``'s per-unit row selection (the kernel's read, after the
    charge; never shown in any output, ledger entry or error)."""
    with engine_errors("reading the policy"):
        row = con.execute("SELECT unit_key FROM dpsql.policies WHERE table_name = ?",
                          [table.lower()]).fetchone()
    if row is None or not isinstance(row[0], str) or len(row[0]) != 64:
        raise PolicyError(f"table {table!r} declares a privacy unit but has no selection key; "
                          "protect it again (dpsql protect --replace)")
    return row[0]


def load_policies(con) -> dict[str, TablePolicy]:
    if not has_schema(con):
        return {}
    with engine_errors("reading policies"):
        rows = con.execute("SELECT table_name, policy FROM dpsql.policies").fetchall()
    return {name: TablePolicy.from_json(text) for name, text in rows}


def spends(con, table: str) -> list:
    """Every standard-DP charge of ``table`` as the accountant sees it (released or not;
    metric releases have their own budget)."""
    if not has_schema(con):
        return []
    with engine_errors("reading the ledger"):
        rows = con.execute("SELECT epsilon_exact, delta_exact, mechanism, rho FROM dpsql.ledger "
                           "WHERE table_name = ? AND metric_epsilon_exact IS NULL",
                           [table]).fetchall()
    return [composition.Spend.of(fraction_from_text(eps), fraction_from_text(delta),
                                 mechanism, rho) for eps, delta, mechanism, rho in rows]


def _policy(con, policy: TablePolicy | str) -> TablePolicy:
    if isinstance(policy, TablePolicy):
        return policy
    policies = load_policies(con)
    if policy.lower() not in policies:
        raise PolicyError(f"table {policy!r} is not protected")
    return policies[policy.lower()]


def total(con, policy: TablePolicy | str) -> composition.Total:
    """The accountant's reading of the table's charges against its budget (a policy, or the
    name of a protected table)."""
    policy = _policy(con, policy)
    return composition.compose(spends(con, policy.table), policy.budget)


def spent(con, policy: TablePolicy | str) -> PrivacyCost:
    """The (ε, δ) reported as spent on the table (:meth:`composition.Total.reported`): basic
    composition while it covers every release, then the zCDP route's ``(ε(Σρ, δ_z), δ_z)``.
    A table whose policy is not stored reads as basic composition."""
    if isinstance(policy, str) and policy.lower() not in load_policies(con):
        return composition.compose(spends(con, policy.lower()),
                                   composition.Budget(0, 0)).basic
    policy = _policy(con, policy)
    return total(con, policy).reported(policy.budget)


def accounting_method(con, policy: TablePolicy | str) -> str:
    """``basic`` or ``zcdp``: which route gives the table's reported total."""
    return total(con, policy).method


def check_fits(con, policy: TablePolicy, cost: PrivacyCost, mechanism: str,
               rho: float | None) -> None:
    """Refuse a request the budget cannot take under the accountant (writes nothing)."""
    composition.check(policy.table, spends(con, policy.table),
                      composition.Spend.of(cost.epsilon, cost.delta, mechanism, rho),
                      policy.budget)


def spent_metric(con, table: str) -> Fraction:
    """Exact total ε per unit distance charged to ``table``'s metric (d_X) budget."""
    if not has_schema(con):
        return Fraction(0)
    with engine_errors("reading the ledger"):
        rows = con.execute("SELECT metric_epsilon_exact FROM dpsql.ledger WHERE table_name = ? "
                           "AND metric_epsilon_exact IS NOT NULL", [table]).fetchall()
    return sum((fraction_from_text(r[0]) for r in rows), Fraction(0))


def check_metric(con, policy: TablePolicy, requested: Fraction) -> None:
    """Refuse a metric charge the table's metric budget cannot take (writes nothing)."""
    if policy.metric is None:
        raise PolicyError(f"table {policy.table!r} declares no metric model; metric (d_X) "
                          "releases need a [tables.<name>.metric] section in its policy")
    already = spent_metric(con, policy.table)
    limit = policy.metric.epsilon_per_unit
    if already + requested > limit:
        raise BudgetExceededError(policy.table, "metric epsilon", already, requested, limit)


@dataclass(frozen=True)
class Charge:
    """What a release is about to cost, and how it is made (recorded with the charge)."""

    table: str
    cost: PrivacyCost
    mechanism: str
    strategy: str
    calibration: str | None
    sigma: float | None
    sensitivity: float | None
    rho: float | None
    n_queries: int
    n_cells: int
    expected_rmse: float | None
    sql_text: str
    result_tables: object  # list of names, or a function release_id -> list of names
    private: bool
    release_name: str | None = None  # unique; re-running a named release never re-noises
    bound_ratio: float | None = None  # expected RMSE / singular value bound RMSE
    metric_epsilon: Fraction | None = None  # d_X releases: ε per unit distance charged
    request: str | None = None        # the request's parameters as asked (JSON), for replays
    reused_from: str | None = None    # past releases whose measurements the answers combine


def charge(con, policy: TablePolicy, request: Charge) -> tuple[int, list[str]]:
    """Check the budget and record the charge in one transaction.

    Returns the release id and the result table names (``request.result_tables`` may be a
    function of the new release id, for default names).

    Raises :class:`BudgetExceededError` (nothing written) when it does not fit.
    """
    ensure_schema(con)
    with engine_errors("charging the ledger"):
        con.execute("BEGIN TRANSACTION")
    try:
        composition.check(policy.table, spends(con, policy.table),
                          composition.Spend.of(request.cost.epsilon, request.cost.delta,
                                               request.mechanism, request.rho),
                          policy.budget)
        if request.metric_epsilon is not None:
            check_metric(con, policy, request.metric_epsilon)
        with engine_errors("charging the ledger"):
            (next_id,) = con.execute(
                "SELECT coalesce(max(release_id), 0) + 1 FROM dpsql.ledger").fetchone()
            names = (request.result_tables(int(next_id)) if callable(request.result_tables)
                     else list(request.result_tables))
            con.execute(
                "INSERT INTO dpsql.ledger (release_id, table_name, epsilon, delta, epsilon_exact,"
                " delta_exact, rho, mechanism, strategy, calibration, sigma, sensitivity, "
                "n_queries, n_cells, expected_rmse, sql_text, result_tables, private, status, "
                "release_name, bound_ratio, metric_epsilon, metric_epsilon_exact, request, "
                "reused_from) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "'charged', ?, ?, ?, ?, ?, ?)",
                [next_id, policy.table, float(request.cost.epsilon), float(request.cost.delta),
                 fraction_to_text(request.cost.epsilon), fraction_to_text(request.cost.delta),
                 request.rho, request.mechanism, request.strategy, request.calibration,
                 request.sigma, request.sensitivity, request.n_queries, request.n_cells,
                 request.expected_rmse, request.sql_text, names,
                 request.private, request.release_name, request.bound_ratio,
                 None if request.metric_epsilon is None else float(request.metric_epsilon),
                 None if request.metric_epsilon is None
                 else fraction_to_text(request.metric_epsilon), request.request,
                 request.reused_from])
            con.execute("COMMIT")
        return int(next_id), names
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:  # the transaction may already be gone
            pass
        raise


def mark_released(con, release_id: int, tables: Sequence[tuple[int, str, str, int]]) -> None:
    """Record the written result tables (statement index, name, sql, rows)."""
    with engine_errors("recording the release"):
        if tables:        # one statement for every table of the release
            index, name, sql, n_rows = (list(col) for col in zip(*tables))
            con.execute("INSERT INTO dpsql.release_tables SELECT ?, unnest(?::INTEGER[]), "
                        "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::BIGINT[])",
                        [release_id, index, name, sql, n_rows])
        con.execute("UPDATE dpsql.ledger SET status = 'released' WHERE release_id = ?",
                    [release_id])


#: every relation in main, lower case: result tables are views (schema version 3 on) or
#: base tables (written before)
_MAIN_RELATIONS = ("SELECT lower(table_name) AS name FROM duckdb_tables() WHERE schema_name "
                   "= 'main' UNION ALL SELECT lower(view_name) FROM duckdb_views() "
                   "WHERE schema_name = 'main' AND NOT internal")


def is_result_table(con, name: str) -> bool:
    """Whether ``name`` is a relation in main that a dpsql release wrote (a view over the
    release's stored answers, or a base table written before schema version 3)."""
    if not has_schema(con):
        return False
    with engine_errors("reading the catalog"):
        row = con.execute(
            f"SELECT count(*) FROM dpsql.release_tables r JOIN ({_MAIN_RELATIONS}) t "
            "ON lower(r.table_name) = t.name WHERE lower(r.table_name) = lower(?)",
            [name]).fetchone()
    return bool(row[0])


def result_names(con) -> list[str]:
    """The result tables (views or base tables) present in main that dpsql releases wrote
    (lower case)."""
    if not has_schema(con):
        return []
    with engine_errors("reading the catalog"):
        rows = con.execute(
            f"SELECT DISTINCT lower(r.table_name) FROM dpsql.release_tables r JOIN "
            f"({_MAIN_RELATIONS}) t ON lower(r.table_name) = t.name").fetchall()
    return [r[0] for r in rows]


def table_owner(con, name: str) -> int | None:
    """The release that last wrote result table ``name`` (None if dpsql never wrote it)."""
    if not has_schema(con):
        return None
    with engine_errors("reading the ledger"):
        row = con.execute("SELECT max(release_id) FROM dpsql.release_tables "
                          "WHERE lower(table_name) = lower(?)", [name]).fetchone()
    return None if row[0] is None else int(row[0])


def find_named(con, name: str) -> dict | None:
    """The ledger entry of the release called ``name``, if any."""
    if not has_schema(con):
        return None
    with engine_errors("reading the ledger"):
        cur = con.execute(f"SELECT {LEDGER_COLUMNS} FROM dpsql.ledger WHERE release_name = ?",
                          [name])
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row))


def entries(con, table: str | None = None) -> list[dict]:
    if not has_schema(con):
        return []
    sql = f"SELECT {LEDGER_COLUMNS} FROM dpsql.ledger"
    params: list = []
    if table is not None:
        sql += " WHERE table_name = ?"
        params.append(table)
    with engine_errors("reading the ledger"):
        cur = con.execute(sql + " ORDER BY release_id", params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def remaining(policy: TablePolicy, reading: composition.Total) -> PrivacyCost:
    """What is left, never below 0: ε against the reported total, δ what basic composition may
    still charge (``δ_B − δ_z − Σ δᵢ``; the zCDP route spends ρ, not δ)."""
    used = reading.reported(policy.budget)
    return PrivacyCost(max(policy.epsilon - used.epsilon, Fraction(0)),
                       max(policy.budget.basic_delta - reading.basic.delta, Fraction(0)))


__all__ = ["Charge", "charge", "ensure_schema", "entries", "load_policies", "mark_released",
           "remaining", "save_policy", "spent", "spent_metric", "total", "Fraction"]
