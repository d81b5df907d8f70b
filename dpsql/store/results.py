"""Release objects, explanations, and the result tables they are written to.

Each statement of a released batch becomes one result table in the main schema (a view over
the release's stored answers in ``dpsql_results``: :func:`dpsql.store.database.write_tables`;
read it as any table, drop it with ``DROP VIEW``): its group-key
columns (NULL where a grouping set rolls a column up, or for the NULL group of a nullable
column), ``grouping_id`` when the statement has several grouping sets (bit i set when the
i-th key column is rolled up, as DuckDB's ``GROUPING()``), then the noisy ``count``, its exact
``stderr`` and the 95% interval ``ci_low``/``ci_high`` (Gaussian noise: normal, the answers
are linear in the noise; Laplace noise: a bound on the quantile of the Laplace sum, see
:func:`dpsql.mechanisms.halfwidths.interval_halfwidths`). ``dpsql.release_tables`` links every table to its ledger entry.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from dpsql.store.database import key_sql_type
from dpsql.errors import UnsupportedQueryError

Z95 = 1.959963984540054  # Φ⁻¹(0.975)

_NOISE_SHORT = {"gaussian": "gauss", "laplace": "laplace", "mwem": "mwem", "dx_laplace": "d_X"}


@dataclass(frozen=True)
class Candidate:
    """One strategy's expected accuracy for a batch (no data, no budget)."""

    strategy: str
    sigma: float
    sensitivity: float
    rmse: float
    stderr: np.ndarray = field(repr=False)
    note: str = ""
    seconds: float = 0.0             # time to select (or load) the strategy
    bound_ratio: float = math.nan    # expected RMSE / RMSE of the lower bound (Explanation)
    cached: bool = False             # loaded from the strategy cache
    plan: object = field(default=None, repr=False, compare=False)
    mechanism: str = "gaussian"      # noise family: gaussian (sigma) or laplace (scale b)
    #: the plan's least-squares solver (chosen candidate only; its factorisation is read
    #: from the selection cache, or computed, when first used)
    solver: object = field(default=None, repr=False, compare=False)

    @property
    def gap(self) -> float:
        """The certified relative duality gap of an optimised plan (nan when not reported)."""
        notes = getattr(self.plan, "notes", ()) or ()
        for note in notes:
            if isinstance(note, tuple) and len(note) == 2 and note[0] == "gap":
                return float(note[1])
        return math.nan


@dataclass(frozen=True)
class Explanation:
    """What a request would cost and how accurate it would be. Reads no data."""

    table: str
    epsilon: float
    delta: float
    strategy: str
    sigma: float
    rmse: float                      # expected workload RMSE: sqrt(mean stderr²)
    stderr: np.ndarray               # per query (per W row), in statement order
    n_queries: int
    n_cells: int
    candidates: tuple                # every strategy considered (Candidate)
    statements: tuple = ()           # (statement index, first row, stop row)
    bound_rmse: float = math.nan     # RMSE of the lower bound (no strategy beats it)
    mechanism: str = "gaussian"      # noise family of the chosen strategy ("reuse": none)
    free: tuple = ()                 # rows of W answered from past releases at no cost
    reused_from: tuple = ()          # the release ids whose measurements are combined
    #: how old and new answers meet in a partly free batch ('': one GLS over both)
    reuse_rule: str = ""
    bound_note: str = ""             # why the bound was not computed (planning limits)
    #: which lower bound ``bound_rmse`` is: the singular value bound, or the certified dual
    #: bound of the ``optimal`` solver when it ran (tighter; see mechanisms/selection.py)
    bound_name: str = "svdb"
    #: a batch mixing COUNT with SUM/AVG (issue 20): one line per data vector (its
    #: aggregate, strategy, noise scale, share and expected RMSE in its own units)
    parts: tuple = ()
    planned_rho: float | None = None  # the zCDP ρ the charge will record, when known

    @property
    def bound_ratio(self) -> float:
        return self.rmse / self.bound_rmse if self.bound_rmse > 0 else math.nan

    def __str__(self) -> str:
        noise = {"gaussian": "noise: Gaussian (sigma); Laplace (scale b, pure epsilon, no "
                             "delta spent) competes under auto",
                 "laplace": "noise: Laplace (pure epsilon-DP), scale b",
                 "mwem": "MWEM (pure epsilon-DP, data-dependent)",
                 "dx_laplace": "d_X Laplace (metric privacy; epsilon per unit distance)",
                 "reuse": "no new noise: every answer comes from past releases"}
        # the bound is the chosen noise's: say so where it is not the Gaussian rows' own
        under = " for Laplace noise" if self.mechanism == "laplace" else ""
        bound = (f"; lower bound ({self.bound_name}){under} RMSE {self.bound_rmse:.4g}"
                 if math.isfinite(self.bound_rmse) else
                 f"; {self.bound_note}" if self.bound_note else "")
        how = ("one charge, measured in blocks (below)" if self.parts
               else noise.get(self.mechanism, self.mechanism))
        lines = [
            f"table {self.table}: {self.n_queries} queries over {self.n_cells} cells; "
            f"epsilon={self.epsilon:g}, delta={self.delta:g}; {how}{bound}",
        ]
        lines += list(self.parts)
        if self.candidates:
            lines.append(f"{'strategy':<12} {'noise':<8} {'scale':>10} {'sensitivity':>11} "
                         f"{'expected RMSE':>14} {'x bound':>8} {'seconds':>8}")
        for c in self.candidates:
            mark = (" <- chosen" if c.strategy == self.strategy
                    and c.mechanism == self.mechanism else "")
            noise = _NOISE_SHORT.get(c.mechanism, c.mechanism)
            if np.isfinite(c.rmse):
                cached = " (cached)" if c.cached else ""
                gap = f" gap {c.gap:.1e}" if math.isfinite(c.gap) else ""
                lines.append(f"{c.strategy:<12} {noise:<8} {c.sigma:>10.4g} "
                             f"{c.sensitivity:>11.4g} {c.rmse:>14.4g} {c.bound_ratio:>8.3f} "
                             f"{c.seconds:>8.2f}{mark}{cached}{gap}")
            else:
                lines.append(f"{c.strategy:<12} {noise:<8} {'-':>10} {'-':>11} {'n/a':>14} "
                             f"{'-':>8} {c.seconds:>8.2f}  {c.note}")
        if self.reused_from:
            lines.append(self._reuse_summary())
        return "\n".join(lines)

    def _reuse_summary(self) -> str:
        """Which answers are free (from past releases) and which are measured now."""
        free = set(self.free)
        ids = ", ".join(str(r) for r in self.reused_from)
        head = (f"reuse: {len(free)} of {self.n_queries} answers come from past releases "
                f"({ids}) at no privacy cost; ")
        head += ("nothing is measured, nothing is charged" if len(free) == self.n_queries
                 else f"{self.n_queries - len(free)} are measured now (the candidates above "
                      "are for those), and " + (self.reuse_rule or
                      "every answer combines old and new measurements by generalised least "
                      "squares"))
        rows = []
        for index, start, stop in self.statements:
            for k in range(start, stop):
                kind = "free" if k in free else "new"
                rows.append(f"  statement {index + 1} row {k - start + 1}: {kind}, "
                            f"stderr {self.stderr[k]:.4g}")
        if len(rows) > 20:
            rows = rows[:20] + [f"  ... ({len(rows) - 20} more rows)"]
        return "\n".join([head] + rows)


@dataclass(frozen=True)
class ResultTable:
    """One statement's released answers, as written to the database."""

    name: str
    columns: tuple                   # column names
    rows: list                       # list of tuples
    #: each column's DuckDB type when known (a result table read back); empty for a release's
    #: own tables (their last four columns are DOUBLE, the keys' types follow their values)
    types: tuple = ()

    def __str__(self) -> str:
        return format_table(self.columns, self.rows, title=self.name)


@dataclass(frozen=True)
class Release:
    """A completed, charged release."""

    release_id: int
    table: str
    tables: list                     # result table names, in statement order
    epsilon: float
    delta: float
    strategy: str
    sigma: float
    expected_rmse: float
    results: list                    # ResultTable per statement
    private: bool
    name: str | None = None          # the release name, when one was given
    reused: bool = False             # True: recorded answers returned again, nothing charged

    def __str__(self) -> str:
        rmse = (f"{self.expected_rmse:.4g}" if math.isfinite(self.expected_rmse)
                else "per aggregate (see explain)" if self.strategy.startswith("joint(")
                else "n/a (data-dependent)")
        eps = ("metric epsilon" if self.strategy == "dx_laplace" else "epsilon")
        head = (f"release {self.release_id} on {self.table}: {eps}={self.epsilon:g} "
                f"delta={self.delta:g} strategy={self.strategy} expected RMSE={rmse}")
        if not self.private:
            head += "  [NON-PRIVATE: seeded test noise]"
        if self.reused:
            head += f"  [recorded answers of release {self.name!r}; nothing charged]"
        return head + "\n\n" + "\n\n".join(str(r) for r in self.results)


#: longest result table name (characters); DuckDB has no limit, but a name this long is a
#: mistake, and every interface prints it
MAX_RESULT_NAME = 128

#: result names starting with these (any case) are refused: dpsql's own tables and DuckDB's
#: catalog views (a table of that name in main would shadow them)
RESERVED_PREFIXES = ("dpsql", "duckdb_", "pg_", "sqlite_", "information_schema")


def check_result_names(queries, protected) -> set:
    """Refuse result table names that could not be written or would clash; the lower-cased
    names given. Public inputs only (the query text and the protected tables' names), so
    ``explain`` and ``answer`` call it while planning, before any charge: a name refused
    here never costs budget (docs/threat-model.md).

    Refused: an empty name, one with leading or trailing whitespace (so a whitespace-only
    one), control or invisible format characters (NUL, newline, zero-width space), more than
    :data:`MAX_RESULT_NAME` characters, a protected table's name, a name starting with one
    of :data:`RESERVED_PREFIXES`, and two statements naming the same table in any case."""
    names: set = set()
    for q in queries:
        name = q.target
        if name is None:
            continue
        where = f"statement {q.index + 1}: result table name {name[:40]!r}"
        if not name.strip():
            raise UnsupportedQueryError(f"statement {q.index + 1}: the result table name is "
                                        f"empty or blank ({name!r}); name the table")
        if name != name.strip():
            raise UnsupportedQueryError(f"{where} starts or ends with whitespace; drop it")
        if any(unicodedata.category(ch)[0] in "CZ" and ch != " " for ch in name):
            raise UnsupportedQueryError(f"{where} contains a control, invisible or "
                                        "non-space whitespace character; use plain characters")
        if len(name) > MAX_RESULT_NAME:
            raise UnsupportedQueryError(f"{where}... has {len(name)} characters, more than the "
                                        f"limit of {MAX_RESULT_NAME}; use a shorter name")
        low = name.lower()
        if low in protected or low.startswith(RESERVED_PREFIXES):
            raise UnsupportedQueryError(
                f"result table name {name!r} is reserved (a protected table, dpsql's or "
                "DuckDB's catalog); choose another name")
        if low in names:
            raise UnsupportedQueryError(f"result table {name!r} is named twice in the batch "
                                        "(names are case-insensitive)")
        names.add(low)
    return names


def build_columns(output, policy, answers: np.ndarray, stderr: np.ndarray,
                  halfwidth: np.ndarray, interval: tuple | None = None):
    """(name, SQL type, values) for one statement's result table. ``interval``: the 95%
    interval's ends per row when they are not ``answer ± halfwidth`` (AVG, clipped to its
    range); NaN answers (an AVG over a noisy count <= 0) are NULL."""
    if getattr(output, "assembled", False):   # quantiles, public groups: dpsql.sql.assembled
        return output.columns(answers, stderr, halfwidth,
                              lambda source: key_sql_type(policy.column(source)))
    cols = []
    for i, (source, out) in enumerate(zip(output.key_sources, output.key_columns)):
        values = [k[i] for k in output.keys]
        cols.append((out, key_sql_type(policy.column(source)), values))
    if output.grouping_ids is not None:
        cols.append(("grouping_id", "INTEGER", list(output.grouping_ids)))
    a = answers[output.start:output.stop]
    s = stderr[output.start:output.stop]
    h = halfwidth[output.start:output.stop]
    low, high = (a - h, a + h) if interval is None else (
        interval[0][output.start:output.stop], interval[1][output.start:output.stop])
    cols.append((output.query.count_name, "DOUBLE", _nulls(a)))
    cols.append(("stderr", "DOUBLE", _nulls(s)))         # NULL: no standard error (MWEM)
    cols.append(("ci_low", "DOUBLE", _nulls(low)))
    cols.append(("ci_high", "DOUBLE", _nulls(high)))
    return cols


def _nulls(values: np.ndarray) -> list:
    return [None if math.isnan(v) else v for v in values.tolist()]


def format_table(columns, rows, title: str | None = None, max_rows: int = 40) -> str:
    """Aligned text table (numbers right-aligned, floats to 4 significant digits)."""
    def show(v):
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return f"{v:.1f}" if abs(v) >= 100 else f"{v:.4g}"
        return str(v)

    shown = [[show(v) for v in row] for row in rows[:max_rows]]
    widths = [max([len(str(c))] + [len(r[i]) for r in shown]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows)
               for i in range(len(columns))]

    def fmt(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric))

    out = [title] if title else []
    out.append(fmt([str(c) for c in columns]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(fmt(r) for r in shown)
    if len(rows) > max_rows:
        out.append(f"... ({len(rows) - max_rows} more rows)")
    return "\n".join(out)
