"""THE data-path query: the marginals of cliques over the declared parts, built once.

:func:`marginals_query` returns one sqlglot expression; each engine renders it in its own
dialect (``Expression.sql(dialect="duckdb")`` or ``"spark"``) and runs it. It is the only
query that reads protected rows, in any engine. Shape (one scan, three levels)::

    SELECT coalesce(CAST(p_i AS BIGINT), -1) AS p_i, …, <set> AS set, sum(n) AS n
    FROM (SELECT <part of k_i> AS p_i, …, n                -- level 3: parts of the keys
          FROM (SELECT <k_i>, …, count(*) AS n            -- level 2: one row per key
                FROM <rows> GROUP BY <k_i>, …))
    GROUP BY GROUPING SETS ((p_a, p_b), (p_b, p_c), …)    -- level 1: every clique at once

A key ``k_i`` is the raw column when few distinct values are expected (the part is then
computed once per distinct value) or else the part computed per row
(:func:`dpsql.engines.mapping.groups_by_raw_value`); either way the counts are the same.
The data vector is the marginal of the clique of all used columns. Every part expression
is total (never NULL: :mod:`dpsql.engines.mapping`), so a NULL part in the output means the
column is rolled up in that grouping set; ``set`` says which (bit ``d−1−k`` set when the
``k``-th used column is rolled up).

Two additions (issue 20), built here once and rendered alike for every engine:

- ``aggregates``: the list of :class:`Aggregate` columns; COUNT is the default. A clamped
  per-cell sum is ``Aggregate("s0", row=<value in whole units>, exact=True)``
  (:func:`dpsql.engines.mapping.value_units`): summed per key at level 2, per cell at
  level 1, as an exact BIGINT.
- ``cap`` (:class:`Cap`): under user-level privacy at most ``k`` rows per unit are read.
  Every used column is then mapped per row (its part), and each unit's rows are ranked by
  ``sha256(key | part_0 | … | value units …)`` over what the query reads from them, as
  decimal digits of integers: text both engines write alike, so DuckDB (``sha256``) and
  Spark (``sha2(…, 256)``) keep the same rows. The choice depends on the unit's own rows
  only (removing a unit leaves every other unit's rows as they were), and rows that tie
  read alike in everything the query uses, so which of them is kept changes nothing. A NULL
  unit: each row its own unit, always kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
from sqlglot import exp

from dpsql.engines import mapping


@dataclass(frozen=True)
class UsedColumn:
    """One column the query maps: its declared domain, its units' parts, how its SQL type
    is read (:func:`dpsql.engines.mapping.kind`)."""

    name: str
    domain: object
    unit_to_part: np.ndarray
    how: str

    @property
    def n_parts(self) -> int:
        return int(np.asarray(self.unit_to_part).max()) + 1


@dataclass(frozen=True)
class Aggregate:
    """One aggregate per cell. ``row``: the per-row value summed (None: count the rows).
    ``sql_type``: the output column's type."""

    name: str
    row: exp.Expression | None = None
    sql_type: str = "BIGINT"
    #: an exact integer per cell (int64 arrays; sums of whole units) rather than float64
    exact: bool = False

    def per_key(self) -> exp.Expression:
        """The aggregate over the rows of one key (``row`` is read as ``r_<name>``)."""
        value = exp.Count(this=exp.Star()) if self.row is None else \
            exp.Sum(this=exp.column(f"r_{self.name}", quoted=True))
        return exp.alias_(value, self.name, quoted=True)

    def per_cell(self) -> exp.Expression:
        total = exp.cast(exp.Sum(this=exp.column(self.name, quoted=True)), self.sql_type)
        if self.row is not None:        # no rows at all (no GROUP BY): 0, never NULL
            total = exp.Coalesce(this=total, expressions=[mapping.integer(0)])
        return exp.alias_(total, self.name, quoted=True)


COUNT = Aggregate("n")


@dataclass(frozen=True)
class Cap:
    """At most ``k`` rows per value of the column ``unit`` (module docstring); ``key``: the
    table's secret selection key (64 hex digits), read by the kernel after the charge."""

    unit: str
    k: int
    key: str

    def __repr__(self) -> str:          # the key never appears in a repr or a log
        return f"Cap(unit={self.unit!r}, k={self.k})"


class Sum(NamedTuple):
    """A per-cell sum of a bounded value, in whole units ``u = 2**exponent``: each row adds
    its value clamped to ``[lo_units·u, hi_units·u]`` and rounded to whole units; NULL or
    no number: 0 (:func:`dpsql.engines.mapping.value_units`)."""

    column: str
    exponent: int
    lo_units: int
    hi_units: int


def _col(name: str) -> exp.Expression:
    return exp.column(name, quoted=True)


def _named(expression: exp.Expression, name: str) -> exp.Expression:
    return exp.alias_(expression, name, quoted=True)


def _mapped(inner: exp.Select, items: list, keep: list[str]) -> exp.Select:
    """Four projections over ``inner`` (:mod:`dpsql.engines.mapping`): each item
    ``(i, column, raw, out)``'s token ``t{i}`` (text read as numbers), value ``v{i}``, unit
    ``u{i}`` and part, named ``out``; the columns ``keep`` pass through."""
    def select(*cols: exp.Expression, source: exp.Expression, alias: str) -> exp.Select:
        return exp.select(*[_col(k) for k in keep], *cols).from_(
            source.subquery(alias, copy=False), copy=False)

    raws = [_col(raw) for _, _, raw, _ in items]
    tokens = [_named(mapping.token(_col(raw)), f"t{i}") for i, col, raw, _ in items
              if mapping.needs_token(col.domain, col.how)]
    stage = select(*raws, *tokens, source=inner, alias="s0") if tokens else inner
    values = [_named(mapping.value(_col(raw), _col(f"t{i}"), col.domain, col.how), f"v{i}")
              for i, col, raw, _ in items]
    stage = select(*[_col(raw) for _, _, raw, _ in items], *values, source=stage, alias="s1")
    units = [_named(mapping.unit(_col(raw), _col(f"v{i}"), col.domain, col.unit_to_part),
                    f"u{i}") for i, col, raw, _ in items]
    stage = select(*units, source=stage, alias="s2")
    parts = [_named(mapping.part(_col(f"u{i}"), col.domain, col.unit_to_part), out)
             for i, col, _, out in items]
    return select(*parts, source=stage, alias="s3")


def _capped(rows: exp.Select, read: list[str], cap: Cap) -> exp.Select:
    """``rows`` (per-row parts, value units, ``dpsql_unit``) with at most ``cap.k`` rows per
    unit kept, ranked by the keyed hash of ``read`` (module docstring)."""
    text: exp.Expression = exp.Literal.string(cap.key)
    for name in read:
        text = exp.DPipe(this=exp.DPipe(this=text, expression=exp.Literal.string("|")),
                         expression=exp.cast(_col(name), "VARCHAR"))
    order = exp.SHA2(this=text, length=exp.Literal.number(256))
    rank = exp.Window(this=exp.RowNumber(), partition_by=[_col("dpsql_unit")],
                      order=exp.Order(expressions=[exp.Ordered(this=order)]))
    ranked = exp.case().when(exp.Is(this=_col("dpsql_unit"), expression=exp.null()),
                             exp.Literal.number(1)).else_(rank)
    inner = exp.select(*[_col(c) for c in read], _named(ranked, "dpsql_rank")).from_(
        rows.subquery("u", copy=False), copy=False)
    kept = [_col(c) for c in read] or [_named(exp.Literal.number(1), "one")]
    return exp.select(*kept).from_(inner.subquery("c", copy=False), copy=False).where(
        exp.LTE(this=_col("dpsql_rank"), expression=exp.Literal.number(int(cap.k))))


def _rows(relation, columns, used, aggregates, cap):
    """The rows read, keyed (level 3 of the module docstring, before grouping) and the
    indices of the columns grouped by their raw value (none under a cap). Under a cap every
    column of ``columns`` is mapped and hashed, used by this query or not, so that the
    queries of one read (:func:`dpsql.engines.base.marginal_aggregates` splits large
    batches) keep the same rows."""
    mapped = list(range(len(columns))) if cap is not None else used
    measured = [_named(a.row.copy(), f"r_{a.name}") for a in aggregates if a.row is not None]
    unit = [_named(_col(cap.unit), "dpsql_unit")] if cap is not None else []
    scan = exp.select(*[_named(_col(columns[i].name), f"c{i}") for i in mapped], *measured,
                      *unit, *([] if mapped or measured or unit
                               else [_named(exp.Literal.number(1), "one")])).from_(relation)
    raw = [] if cap is not None else [
        i for i in used if mapping.groups_by_raw_value(columns[i].domain, columns[i].how)]
    per_row = [(i, columns[i], f"c{i}", f"k{i}") for i in mapped if i not in raw]
    sums = [f"r_{a.name}" for a in aggregates if a.row is not None]
    rows = (_mapped(scan, per_row, [f"c{i}" for i in raw] + sums
                    + (["dpsql_unit"] if cap is not None else []))
            if per_row else scan)
    if cap is not None:
        rows = _capped(rows, [f"k{i}" for i in mapped] + sums, cap)
    return rows, raw


def marginals_query(relation: exp.Expression, columns: Sequence[UsedColumn],
                    cliques: Sequence[tuple], *, aggregates: Sequence[Aggregate] = (COUNT,),
                    cap: Cap | None = None) -> exp.Select:
    """The query returning, for every non-empty cell of every clique's marginal, its parts
    ``p_i`` (-1 where rolled up), ``set`` and the aggregates (module docstring).

    ``relation``: the table as the engine names it (``main."adult"``, ``db.adult``, a
    temporary view); ``columns``: every column the cliques index; ``cliques``: tuples of
    indices into ``columns`` (deduplicated by the caller); ``cap``: rows kept per unit."""
    used = sorted({int(i) for c in cliques for i in c})
    rows_keyed, raw = _rows(relation, columns, used, aggregates, cap)
    if not used:
        return exp.select(*[a.per_cell() for a in aggregates], _named(exp.Literal.number(0),
                                                                      "set")).from_(
            exp.select(*[a.per_key() for a in aggregates])
            .from_(rows_keyed.subquery("r", copy=False), copy=False)
            .subquery("g", copy=False), copy=False)
    keys = [_named(_col(f"c{i}"), f"k{i}") if i in raw else _col(f"k{i}") for i in used]
    level2 = (exp.select(*keys, *[a.per_key() for a in aggregates])
              .from_(rows_keyed.subquery("k", copy=False), copy=False)
              .group_by(*[_col(f"k{i}") for i in used]))
    passed = [f"k{i}" for i in used if i not in raw] + [a.name for a in aggregates]
    level3 = _mapped(level2, [(i, columns[i], f"k{i}", f"p{i}") for i in raw],
                     passed) if raw else level2
    parts = [_col(f"p{i}") if i in raw else _named(_col(f"k{i}"), f"p{i}") for i in used]
    level3 = exp.select(*parts, *[_col(a.name) for a in aggregates]).from_(
        level3.subquery("m", copy=False), copy=False)
    rolled = [exp.Mul(this=exp.cast(exp.Grouping(expressions=[_col(f"p{i}")]), "BIGINT"),
                      expression=exp.Literal.number(1 << (len(used) - 1 - k)))
              for k, i in enumerate(used)]
    set_expr = rolled[0]
    for term in rolled[1:]:
        set_expr = exp.Add(this=set_expr, expression=term)
    sets = exp.GroupingSets(expressions=[exp.Tuple(expressions=[_col(f"p{i}") for i in c])
                                         for c in cliques])
    outputs = [_named(exp.Coalesce(this=exp.cast(_col(f"p{i}"), "BIGINT"),
                                   expressions=[mapping.integer(-1)]), f"p{i}") for i in used]
    return (exp.select(*outputs, _named(set_expr, "set"), *[a.per_cell() for a in aggregates])
            .from_(level3.subquery("p", copy=False), copy=False).group_by(sets))


def set_id(used: Sequence[int], clique: tuple) -> int:
    """The ``set`` value of ``clique``'s rows (bit d−1−k: the k-th used column rolled up)."""
    return sum(1 << (len(used) - 1 - k) for k, i in enumerate(used) if i not in clique)
