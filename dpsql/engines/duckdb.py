"""The DuckDB engine: the data vector, the ONE query that reads protected rows.

Called only by :mod:`dpsql.kernel.data` (import-linter contracts in ``pyproject.toml``). It
knows nothing of noise. The SQL is generated from the declared policy (identifiers and literals
quoted by :mod:`dpsql.store.database`); no value in a row (NaN, ±inf, out of range,
unparsable) can make it fail, and DuckDB's own error text never leaves (it can contain data
values): every failure becomes :class:`~dpsql.errors.EngineError`.

Two additions to the counting queries (issue 20), each a separate piece of SQL so that a
query builder for other engines can port them one by one: a per-cell sum of a bounded value
(:class:`Sum`, :func:`value_sql`: one more aggregate beside ``count(*)``) and a per-unit row
cap (:class:`Cap`, :func:`capped_source`: the rows read, at most ``k`` per unit, replace the
table in the FROM clause).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from dpsql.errors import EngineError
from dpsql.store.database import engine_errors, quote_ident, quote_literal, table_columns
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain, NumericDomain


def unit_sql(column: str, domain) -> str:
    """SQL mapping a raw value of ``column`` to its unit index (the rule in domain.py)."""
    c = quote_ident(column)
    if isinstance(domain, CategoricalDomain):
        null_unit = domain.null_unit if domain.nullable else domain.other_unit
        if isinstance(domain.values[0], str):
            v = f"CAST({c} AS VARCHAR)"
            values = ", ".join(quote_literal(x) for x in domain.values)
            return (f"CASE WHEN {c} IS NULL THEN {null_unit} ELSE "
                    f"coalesce(list_position([{values}], {v}) - 1, {domain.other_unit}) END")
        # only a value that *is* an integer matches (DuckDB's casts round 2.7 and '2.7' to 3)
        v = f"TRY_CAST({c} AS BIGINT)"
        exact = f"TRY_CAST({c} AS DOUBLE) = {v}"
        values = ", ".join(str(int(x)) for x in domain.values)
        return (f"CASE WHEN {c} IS NULL THEN {null_unit} ELSE "
                f"coalesce(CASE WHEN {exact} THEN list_position([{values}]::BIGINT[], {v}) END"
                f" - 1, {domain.other_unit}) END")
    v = f"TRY_CAST({c} AS DOUBLE)"
    null_unit = domain.null_unit if domain.nullable else 0
    if isinstance(domain, IntegerDomain):
        top = domain.n_value_units - 1
        # clamp *before* the cast to BIGINT, so no value (NaN, +-inf, 1e308, INT64 limits)
        # can make the cast, and with it the whole count, fail; NaN sorts above every number
        return (f"CASE WHEN {v} IS NULL THEN {null_unit} ELSE "
                f"CAST(least(greatest(floor(({v} - ({domain.min})) / {domain.step}), 0), "
                f"{top}) AS BIGINT) END")
    if isinstance(domain, NumericDomain):  # one rule for bins: part_sql's, part = unit
        return part_sql(column, domain, np.arange(domain.n_units))
    raise EngineError("internal error: unknown domain type")


#: column types that hold continuous values: grouping by their raw value could make about one
#: group per row, so their units are computed row by row instead
_CONTINUOUS_TYPES = ("FLOAT", "DOUBLE", "REAL", "DECIMAL", "NUMERIC")


def _groups_by_raw_value(domain, sql_type: str | None) -> bool:
    """Whether the data-vector query groups ``domain``'s column by its raw value first.

    Grouping by the raw column is as cheap as a plain GROUP BY (dictionary-compressed text
    is grouped without looking at the strings), and the unit rule then runs once per distinct
    value instead of once per row. That pays for columns with few distinct values, which is
    what categorical and step-1 integer domains declare; numeric domains (and integer ones
    with a step, or any domain over a floating-point or decimal column) usually sit on
    columns with a value per row, so their part is computed per row. Either way the counts
    are the same: only the speed depends on this choice.

    Trade-off: a categorical or step-1 integer domain declared over a column with about one
    value per row (an id) makes the inner GROUP BY as slow as a plain GROUP BY of that
    column (about 0.9 s instead of 0.1 s per 10 million rows on 2 cores).
    """
    if sql_type is not None and sql_type.upper().startswith(_CONTINUOUS_TYPES):
        return False
    if isinstance(domain, CategoricalDomain):
        return True
    return isinstance(domain, IntegerDomain) and domain.step == 1


def part_sql(column: str, domain, unit_to_part: np.ndarray) -> str:
    """SQL mapping a raw value of ``column`` to its part: ``unit_to_part[unit]``.

    For a numeric domain the units are consecutive bins, so runs of bins in one part are
    tested together: one ``WHEN v < edge`` per change of part instead of one per bin, and no
    list lookup (the same comparisons as :func:`unit_sql`, so the same parts).
    """
    if isinstance(domain, NumericDomain):
        v = f"TRY_CAST({quote_ident(column)} AS DOUBLE)"
        top = domain.n_value_units - 1
        null_part = int(unit_to_part[domain.null_unit if domain.nullable else 0])
        whens = " ".join(f"WHEN {v} < {quote_literal(domain.edges[u + 1])} "
                         f"THEN {int(unit_to_part[u])}"
                         for u in range(top) if unit_to_part[u] != unit_to_part[u + 1])
        last = int(unit_to_part[top])
        if not whens and null_part == last:
            return f"({last})"
        return f"(CASE WHEN {v} IS NULL THEN {null_part} {whens} ELSE {last} END)"
    unit = unit_sql(column, domain)
    if np.array_equal(unit_to_part, np.arange(len(unit_to_part))):
        return f"({unit})"
    mapping = ", ".join(str(int(p)) for p in unit_to_part)
    return f"([{mapping}][({unit}) + 1])"


class Sum(NamedTuple):
    """A per-cell sum of a bounded value, in whole units ``u = 2**exponent``: each row adds
    its value clamped to ``[lo_units·u, hi_units·u]`` and rounded to a whole number of units;
    NULL or unreadable: 0 (:mod:`dpsql.workload.values`)."""

    column: str
    exponent: int
    lo_units: int
    hi_units: int


class Cap(NamedTuple):
    """At most ``k`` rows per value of ``unit`` (a NULL unit: each row its own unit), chosen
    by the smallest keyed hash of the row's ``columns`` (the key is secret, 64 hex digits)."""

    unit: str
    k: int
    key: str
    columns: tuple


def value_sql(s: Sum) -> str:
    """SQL of one row's value in whole units (an integer in ``[lo_units, hi_units]``, or 0).

    The clamp runs on doubles before the rounding (bounds and scale are powers of two times
    integers, exact in a double), so no value (NaN: ``hi``, ±inf, 1e308, text) can make the
    cast fail; the integer clamp after it makes the bound hold whatever the rounding did."""
    v = f"TRY_CAST({quote_ident(s.column)} AS DOUBLE)"
    lo, hi = float(s.lo_units) * 2.0 ** s.exponent, float(s.hi_units) * 2.0 ** s.exponent
    scaled = f"round(least(greatest({v}, {lo!r}), {hi!r}) * {2.0 ** -s.exponent!r})"
    return (f"CASE WHEN {v} IS NULL THEN 0 ELSE least(greatest(CAST({scaled} AS BIGINT), "
            f"{int(s.lo_units)}), {int(s.hi_units)}) END")


def capped_source(table: str, cap: Cap | None) -> str:
    """The FROM clause of a count: the table, or its rows kept under a per-unit cap.

    Each unit's rows are ranked by ``sha256(key || sha256(column_1) || …)`` over the unit and
    the columns the query reads (each as ``'v' || text``, NULL as ``'n'``, hashed to a fixed
    length so that no two different rows read alike); the first ``k`` are kept. The choice
    depends on the unit's own rows only (removing one unit leaves every other unit's rows as
    they were) and rows that tie read alike in every column the query uses, so which of them
    is kept changes nothing. Rows whose unit is NULL are each a unit of their own: all kept.
    """
    if cap is None:
        return f"main.{quote_ident(table)}"
    u = quote_ident(cap.unit)
    cols = list(dict.fromkeys([cap.unit, *cap.columns]))
    fields = " || ".join(f"sha256(coalesce('v' || CAST({quote_ident(c)} AS VARCHAR), 'n'))"
                         for c in cols)
    order = f"sha256({quote_literal(cap.key)} || {fields})"
    listed = ", ".join(quote_ident(c) for c in cols)
    ranked = (f"SELECT {listed}, CASE WHEN {u} IS NULL THEN 1 ELSE row_number() OVER "
              f"(PARTITION BY {u} ORDER BY {order}) END AS dpsql_rank "
              f"FROM main.{quote_ident(table)}")
    return f"(SELECT {listed} FROM ({ranked}) WHERE dpsql_rank <= {int(cap.k)}) AS dpsql_capped"


def data_vector_sql(table: str, columns: Sequence[tuple[str, object, np.ndarray]], *,
                    column_types: Mapping[str, str] | None = None,
                    sums: Sequence[Sum] = (), cap: Cap | None = None) -> str:
    """One query returning ``(cell, count, sum_0, …)`` for every non-empty cell.

    ``columns``: (name, domain, unit_to_part) per used column, slowest-varying first.
    ``column_types`` (optional, name -> DuckDB type as in :func:`table_columns`) only
    steers the plan (see :func:`_groups_by_raw_value`), never the counts. ``sums``: the
    per-cell sums of bounded values (:func:`value_sql`, HUGEINT); ``cap``: rows kept per unit
    (:func:`capped_source`).

    Two levels: the inner GROUP BY keys each column either by its raw value or by its part
    (computed per row); the outer query maps every distinct raw key to its part with the
    same rule (:func:`part_sql`), combines the parts into the cell index and sums.
    """
    source = capped_source(table, cap)
    inner_sums = "".join(f", coalesce(sum({value_sql(v)}), 0) AS s{i}" for i, v in enumerate(sums))
    outer_sums = "".join(f", CAST(sum(s{i}) AS HUGEINT) AS s{i}" for i in range(len(sums)))
    pass_sums = "".join(f", s{i}" for i in range(len(sums)))
    if not columns:
        return f"SELECT 0 AS cell, count(*) AS n{inner_sums} FROM {source}"
    types = column_types or {}
    keys, terms = [], []
    stride = 1
    for i, (name, domain, unit_to_part) in reversed(list(enumerate(columns))):
        key = f"k{i}"
        if _groups_by_raw_value(domain, types.get(name.lower())):
            keys.append(f"{quote_ident(name)} AS {key}")
            part = part_sql(key, domain, unit_to_part)
        else:
            keys.append(f"{part_sql(name, domain, unit_to_part)} AS {key}")
            part = key
        n_parts = int(unit_to_part.max()) + 1
        terms.append(part if stride == 1 else f"{part} * {stride}")
        stride *= n_parts
    cell = " + ".join(reversed(terms))
    inner = (f"SELECT {', '.join(reversed(keys))}, count(*) AS n{inner_sums} "
             f"FROM {source} GROUP BY ALL")
    return (f"SELECT cell, CAST(sum(n) AS BIGINT) AS n{outer_sums} FROM (SELECT "
            f"CAST({cell} AS BIGINT) AS cell, n{pass_sums} FROM ({inner})) GROUP BY cell")


def data_vector(con, table: str, columns, n_cells: int, *, cap: Cap | None = None
                ) -> np.ndarray:
    """The cell counts ``x`` (float64) by one DuckDB query. Called only by the kernel."""
    return _read(con, table, columns, n_cells, (), cap)[0]


def data_vectors(con, table: str, columns, n_cells: int, sums: Sequence[Sum] = (), *,
                 cap: Cap | None = None) -> tuple[np.ndarray, list]:
    """The cell counts ``x`` (float64) and each bounded value's per-cell sums in whole units
    (int64: exact, under 2**62 for tables under 2**32 rows), by one DuckDB query. Called only
    by the kernel."""
    return _read(con, table, columns, n_cells, sums, cap)


def _read(con, table: str, columns, n_cells: int, sums, cap) -> tuple[np.ndarray, list]:
    types = table_columns(con, table) if columns else None
    sql = data_vector_sql(table, columns, column_types=types, sums=sums, cap=cap)
    lists = ", ".join(f"list({c} ORDER BY cell)" for c in ["n"] + [f"s{i}" for i in
                                                                   range(len(sums))])
    with engine_errors("counting the cells"):
        cells, *got = con.execute(
            f"SELECT list(cell ORDER BY cell), {lists} FROM ({sql})").fetchone()
    x = np.zeros(n_cells, dtype=np.float64)
    out = [np.zeros(n_cells, dtype=np.int64) for _ in sums]
    if cells:
        idx = np.asarray(cells, dtype=np.int64)
        if idx.min() < 0 or idx.max() >= n_cells:
            raise EngineError("internal error: a row mapped outside the declared cells")
        x[idx] = np.asarray(got[0], dtype=np.float64)
        for vec, values in zip(out, got[1:]):
            vec[idx] = np.asarray([int(v) for v in values], dtype=np.int64)
    return x, out


# ------------------------------------------------------------------ marginals of cliques

def marginals_sql(table: str, columns: Sequence[tuple[str, object, np.ndarray]],
                  cliques: Sequence[tuple], cap: Cap | None = None) -> str:
    """One query returning ``(part_0, …, part_{d−1}, set, n)`` for every non-empty cell of
    every clique's marginal: one scan, ``GROUP BY GROUPING SETS``.

    ``columns``: (name, domain, unit_to_part) per used column; ``cliques``: tuples of
    indices into ``columns``. ``set`` is ``GROUPING(p_0, …)`` (bit ``d−1−i`` set when
    column ``i`` is rolled up), which names the clique; rolled-up parts read -1.

    The count is the one aggregate here (sums of values take the dense path today); a
    per-unit cap (:func:`capped_source`) replaces the table in the FROM clause, not the
    shape of this call: the engine's one operation stays "the marginals of these cliques
    over these columns' parts".
    """
    used = sorted({i for c in cliques for i in c})
    source = capped_source(table, cap)
    if not used:
        return f"SELECT 0 AS set, count(*) AS n FROM {source}"
    inner = ", ".join(f"{part_sql(columns[i][0], columns[i][1], columns[i][2])} AS p{i}"
                      for i in used)
    keys = ", ".join(f"p{i}" for i in used)
    sets = ", ".join("(" + ", ".join(f"p{i}" for i in c) + ")" for c in cliques)
    parts = ", ".join(f"coalesce(CAST(p{i} AS BIGINT), -1) AS p{i}" for i in used)
    return (f"SELECT {parts}, CAST(GROUPING({keys}) AS BIGINT) AS set, "
            f"CAST(count(*) AS BIGINT) AS n FROM (SELECT {inner} FROM {source}) "
            f"GROUP BY GROUPING SETS ({sets})")


def marginals(con, table: str, columns, cliques, cap: Cap | None = None) -> dict:
    """Each clique's marginal (float64 array, axes in the clique's column order, every
    declared part present, zeros included) by one DuckDB query. Called only by the kernel."""
    cliques = list(dict.fromkeys(tuple(int(i) for i in c) for c in cliques))
    sizes = [int(np.asarray(u).max()) + 1 for _, _, u in columns]
    used = sorted({i for c in cliques for i in c})
    sql = marginals_sql(table, columns, cliques, cap)
    with engine_errors("counting the marginals"):
        got = con.execute(sql).fetchnumpy()
    out = {}
    for c in cliques:
        T = np.zeros(tuple(sizes[i] for i in c), dtype=np.float64)
        if used:
            gid = sum(1 << (len(used) - 1 - k) for k, i in enumerate(used) if i not in c)
            rows = np.flatnonzero(np.asarray(got["set"]) == gid)
            idx = tuple(np.asarray(got[f"p{i}"])[rows].astype(np.int64) for i in c)
            if any(v.size and (v.min() < 0 or v.max() >= sizes[i]) for v, i in zip(idx, c)):
                raise EngineError("internal error: a row mapped outside the declared parts")
            counts = np.asarray(got["n"])[rows].astype(np.float64)
            if c:
                T[idx] = counts
            else:
                T[()] = counts.sum()
        else:
            T[()] = float(np.asarray(got["n"]).sum()) if len(got["n"]) else 0.0
        out[c] = T
    return out
