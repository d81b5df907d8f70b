"""Joins to public tables (issue 20 item 4): ``JOIN dim USING (key)`` / ``ON t.key = dim.key``.

A public table is declared in the protected table's policy with its rows
(:mod:`dpsql.policy.public`); its key is unique and is a categorical column of the protected
table, so the join is many-to-one: a protected row matches at most one public row and counts
once. Such a join needs no data: each of its columns is a *function of the key's declared
value*, so everything a query says about it becomes a condition on the key column's units.

- ``[INNER] JOIN``: the rows whose key has no public row (a declared value missing from the
  public table, the key's ``other`` unit, NULL) are dropped: the statement's WHERE gains
  ``key IN (the public table's keys)``.
- ``LEFT [OUTER] JOIN`` (the protected table on the left): every row is kept; on rows without
  a public row the public columns are NULL (comparisons UNKNOWN, ``IS NULL`` true).
- A condition on a public column (``WHERE level = 'tertiary'``, in any AND/OR/NOT) becomes an
  atom ``units`` on the key column: its truth per key unit, from that unit's public row
  (three-valued: UNKNOWN where the public value is NULL).
- ``COUNT(public_column)`` counts the rows with a public row.
- ``GROUP BY public_column`` groups the key's values by their public value
  (:class:`~dpsql.sql.ir.DimGrouping`): one group per distinct value in the public table, in
  order of first appearance, plus, under a LEFT JOIN, a NULL group for the rows without a
  public row. Every such group is returned, empty or not. :mod:`dpsql.sql.expand` answers it.

Refused, in one line naming the reason, before anything is read or spent: a join with a
protected table (one privacy unit per batch; a join of protected tables can make one
person's row count many times), a table that is neither protected nor public, RIGHT/FULL
outer joins (they add public rows that match nothing: counts change), CROSS/NATURAL/SEMI/
ANTI/ASOF/POSITIONAL joins, a join without ON/USING, and ON anything but the key's equality.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from sqlglot import exp

from dpsql.errors import UnknownTableError, UnsupportedQueryError
from dpsql.sql import hints
from dpsql.sql.ir import Atom, BoolOp, Const, DimGrouping, Predicate, Query
from dpsql.sql.refusals import _is_set, _position, _reject
from dpsql.workload.units import FALSE, TRUE, UNKNOWN

_HINT = hints.hint("join")


@dataclass(frozen=True)
class _Joined:
    table: object                # PublicTable
    qualifiers: frozenset
    left: bool                   # LEFT JOIN (else inner)
    using: bool                  # joined by USING (the key may be named unqualified)


class Joins:
    """The joins of one SELECT: resolves column names and rewrites the finished query."""

    def __init__(self, policy, base, qualifiers: set, joined: list):
        self.policy, self.base, self.qualifiers, self.joined = policy, base, qualifiers, joined

    # ------------------------------------------------------------------ column names
    def column_name(self, col: exp.Column) -> str:
        """A protected column's name, or ``"public_table.column"`` for a public column."""
        qualifier = col.table.lower() if col.table else None
        if qualifier is None or qualifier in self.qualifiers or col.args.get("db"):
            if qualifier is None and not isinstance(col.this, exp.Star):
                found = self._unqualified(col)
                if found is not None:
                    return found
            return self.base(col)
        for j in self.joined:
            if qualifier in j.qualifiers:
                name = col.name.lower()
                if name not in j.table.columns:
                    line, c = _position(col)
                    raise UnsupportedQueryError(
                        f"column {col.name!r} is not a column of public table "
                        f"{j.table.name!r} (its columns: {', '.join(j.table.columns)})", line, c)
                return f"{j.table.name}.{name}"
        return self.base(col)

    def _unqualified(self, col: exp.Column) -> str | None:
        name = col.name.lower()
        owners = [j for j in self.joined if name in j.table.columns]
        if not owners:
            return None
        mine = name in self.policy.column_names
        if mine and all(j.using and j.table.key == name for j in owners):
            return name                      # USING (key): the one key column
        if mine or len(owners) > 1:
            raise _reject(f"the ambiguous column {col.name!r}", col,
                          "it is a column of several joined tables; qualify it "
                          "(table.column)")
        return f"{owners[0].table.name}.{name}"

    # ------------------------------------------------------------------ the rewrite
    def rewrite(self, query: Query) -> Query:
        """The query with every public column turned into conditions on key columns."""
        conjuncts = [] if query.where is None else [self._predicate(query.where)]
        count_column = query.count_column
        if count_column is not None and "." in count_column:
            conjuncts.append(self._matched_atom(self._joined(count_column)))
            count_column = None
        conjuncts += [self._matched_atom(j) for j in self.joined if not j.left]
        where = (None if not conjuncts else conjuncts[0] if len(conjuncts) == 1
                 else BoolOp("and", tuple(conjuncts)))
        names = {c for gs in query.grouping_sets for c in gs if "." in c}
        derived = tuple(self._grouping(n) for n in sorted(names))
        return replace(query, where=where, count_column=count_column, derived=derived)

    def _joined(self, ref: str) -> _Joined:
        return next(j for j in self.joined if j.table.name == ref.split(".")[0])

    def _predicate(self, pred: Predicate) -> Predicate:
        if isinstance(pred, Const):
            return pred
        if isinstance(pred, BoolOp):
            return BoolOp(pred.op, tuple(self._predicate(c) for c in pred.children))
        if "." not in pred.column:
            return pred
        j = self._joined(pred.column)
        column = j.table.column_index(pred.column.split(".")[1])
        truth = [UNKNOWN if pred.op != "isnull" else TRUE] * self._n_units(j)
        for u, row in self._matched_units(j):
            truth[u] = FALSE if pred.op == "isnull" else _compare(pred, row[column])
        return Atom(j.table.key, "units", tuple(truth), pred.line, pred.col)

    def _n_units(self, j: _Joined) -> int:
        return self.policy.column(j.table.key).n_units

    def _matched_units(self, j: _Joined):
        """(unit, public row) for every unit of the key column that has a public row."""
        rows = j.table.row_of()
        domain = self.policy.column(j.table.key)
        for u, value in enumerate(domain.values):
            if value in rows:
                yield u, rows[value]

    def _matched_atom(self, j: _Joined) -> Atom:
        truth = [FALSE] * self._n_units(j)
        for u, _ in self._matched_units(j):
            truth[u] = TRUE
        return Atom(j.table.key, "units", tuple(truth))

    def _grouping(self, ref: str) -> DimGrouping:
        j = self._joined(ref)
        column = ref.split(".")[1]
        k = j.table.column_index(column)
        values: list = []
        unit_group = np.full(self._n_units(j), -1, dtype=np.int64)
        for u, row in self._matched_units(j):
            if row[k] not in values:
                values.append(row[k])
            unit_group[u] = values.index(row[k])
        if j.left:                                   # rows without a public row: NULL
            unit_group[unit_group < 0] = len(values)
            values.append(None)
        return DimGrouping(ref, j.table.key, tuple(values), tuple(unit_group.tolist()),
                           j.table.sql_type(column))


def _compare(atom: Atom, value) -> int:
    """Truth of ``public value op literal`` (both known, so TRUE or FALSE)."""
    literal = atom.value
    if isinstance(value, str) != isinstance(literal, str):
        raise UnsupportedQueryError(
            f"condition on public column {atom.column!r} compares "
            f"{'text' if isinstance(value, str) else 'numbers'} with "
            f"{'text' if isinstance(literal, str) else 'a number'}", atom.line, atom.col)
    if not isinstance(value, str):
        value, literal = Fraction(value), Fraction(literal)
    ok = {"=": value == literal, "<>": value != literal, "<": value < literal,
          "<=": value <= literal, ">": value > literal, ">=": value >= literal}[atom.op]
    return TRUE if ok else FALSE


# ---------------------------------------------------------------------- reading the joins


def read(select: exp.Select, policy, qualifiers: set, base, resolve_table) -> Joins | None:
    """The SELECT's joins (None when it has none), each checked; refusals name the reason."""
    nodes = select.args.get("joins") or []
    if not nodes:
        return None
    joined: list[_Joined] = []
    for node in nodes:
        j = _join(node, policy, resolve_table)
        taken = set(qualifiers).union(*(o.qualifiers for o in joined))
        if j.qualifiers & taken or any(o.table.name == j.table.name for o in joined):
            raise _reject(f"JOIN of {j.table.name!r} a second time or under a name already "
                          "used", node, "join each public table once, under its own name")
        _check_condition(node, j, qualifiers)
        joined.append(j)
    return Joins(policy, base, set(qualifiers), joined)


def _join(node: exp.Join, policy, resolve_table) -> _Joined:
    """The joined table (public), its qualifiers and the join's kind."""
    table = node.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise _reject(f"JOIN with {type(table).__name__.upper()}", node, _HINT)
    if table.args.get("catalog") or (table.args.get("db") and table.db.lower() != "main") \
            or any(_is_set(v) for k, v in table.args.items() if k not in ("this", "db", "alias")):
        raise _reject(f"JOIN with {table.sql()!r}", node, _HINT)
    name = table.name.lower()
    public = policy.public_table(name)
    if public is None:
        _refuse_table(name, table, node, policy, resolve_table)
    alias = table.args.get("alias")
    if alias is not None and (alias.args.get("columns") or not alias.name):
        raise _reject("a table alias with column names", alias)
    left = _kind(node)
    qualifiers = frozenset({alias.name.lower()} if alias is not None else {name})
    return _Joined(public, qualifiers, left, bool(node.args.get("using")))


def _refuse_table(name, table, node, policy, resolve_table) -> None:
    try:
        resolve_table(name, table)
    except UnknownTableError:
        known = ", ".join(p.name for p in policy.public) or "none declared"
        raise _reject(f"JOIN with table {name!r}", table,
                      f"it is not a public table of {policy.table!r} (public tables: "
                      f"{known}); declare it as [tables.{policy.table}.public.{name}] in the "
                      f"policy, then {_HINT}") from None
    raise _reject("JOIN of two protected tables", node,
                  "a batch answers one protected table (a join of protected tables can "
                  "count one person's rows many times); join the result tables afterwards")


def _kind(node: exp.Join) -> bool:
    """True for LEFT [OUTER] JOIN, False for [INNER] JOIN; anything else refused."""
    side = str(node.args.get("side") or "").upper()
    kind = str(node.args.get("kind") or "").upper()
    method = str(node.args.get("method") or "").upper()
    extra = [k for k, v in node.args.items()
             if _is_set(v) and k not in ("this", "side", "kind", "on", "using")]
    if method or extra or kind in ("CROSS", "SEMI", "ANTI"):
        what = method or kind or extra[0].upper()
        raise _reject(f"{what} JOIN", node, _HINT)
    if side in ("RIGHT", "FULL"):
        raise _reject(f"{side} JOIN", node, "it adds public rows that match no protected row, "
                      "which changes counts; use JOIN or LEFT JOIN with the protected table "
                      "first")
    if side == "LEFT" and kind in ("", "OUTER"):
        return True
    if side == "" and kind in ("", "INNER"):
        return False
    raise _reject(f"{side} {kind} JOIN", node, _HINT)


def _check_condition(node: exp.Join, j: _Joined, qualifiers: set) -> None:
    """USING (key) or ON t.key = public.key (either order), nothing else."""
    key = j.table.key
    using = node.args.get("using") or []
    on = node.args.get("on")
    if using:
        names = [u.name.lower() if isinstance(u, (exp.Identifier, exp.Column)) else None
                 for u in using]
        if names != [key] or on is not None:
            raise _reject(f"JOIN {j.table.name!r} USING ({', '.join(map(str, names))})", node,
                          f"the key of {j.table.name!r} is {key!r}: write USING ({key})")
        return
    if on is None:
        raise _reject(f"JOIN of {j.table.name!r} without ON or USING (a cross join)", node,
                      f"write JOIN {j.table.name} USING ({key})")
    sides = [on.this, on.expression] if isinstance(on, exp.EQ) else []
    ok = len(sides) == 2 and all(isinstance(s, exp.Column) and s.name.lower() == key
                                 and s.table for s in sides)
    if ok:
        quals = sorted((s.table.lower() for s in sides), key=lambda q: q in j.qualifiers)
        ok = quals[0] in qualifiers and quals[1] in j.qualifiers
    if not ok:
        raise _reject(f"JOIN ... ON {on.sql()!r}", on,
                      f"join on the key only: ON <table>.{key} = {j.table.name}.{key}, or "
                      f"USING ({key}); put other conditions in WHERE")
