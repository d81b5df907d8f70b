"""Statements answered from other rows of the workload: quantiles, and GROUP BY on a public
table's column (issue 20 items 3 and 4). Public inputs only.

The compiler (:mod:`dpsql.sql.compile`, :mod:`dpsql.sql.implicit`) answers COUNT statements
over the protected table's columns. :func:`expand` turns every other statement into such
counts, in the *same* batch (one workload, one strategy, one charge):

- **GROUP BY a public table's column** (:class:`~dpsql.sql.ir.DimGrouping`): per grouping
  set, one statement per combination of the public columns' groups, with the key column's
  units of that group as a condition (an atom ``units``) and the set's protected columns as
  its GROUP BY. Its rows are exactly the rows the same batch written on the key has.
- **A quantile of column c** (:class:`~dpsql.sql.ir.Quantile`): its *CDF family* over c's K
  declared units, per group of the statement: the prefix counts ``c < e_k`` and the suffix
  counts ``c >= e_k`` at the K-1 interior edges, and ``COUNT(c)``
  (:mod:`dpsql.inference.quantiles` says why both sides). Statements with the same column,
  condition and grouping share one family: several quantiles of one CDF are one measurement.

After compiling, :func:`assemble` replaces each such statement's output by an
:class:`~dpsql.sql.assembled.Assembled` one, which says which rows of ``W`` its result rows
come from; the result table is built from those rows' released answers (post-processing).
A batch of plain COUNT statements is left exactly as it was.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from dpsql import cancel
from dpsql.errors import UnsupportedQueryError
from dpsql.inference.quantiles import Units
from dpsql.sql.assembled import Assembled
from dpsql.sql.ir import Atom, BoolOp, Query
from dpsql.workload.units import FALSE, TRUE

#: the most statements one statement may expand to (combinations of public groups)
MAX_EXPANSION = 10_000


def needs_assembly(q: Query) -> bool:
    return q.quantile is not None or bool(q.derived)


@dataclass
class _Statement:
    """How one statement's result rows come from its sub-statements' rows."""

    query: Query
    subs: list                       # per sub-statement: its plain query indices
    layout: list | None = None       # per result row (sub, row in sub); None: sub 0 as is
    keys: list = field(default_factory=list)
    gids: list = field(default_factory=list)


@dataclass
class Expansion:
    """The plain statements compile sees, and how to answer the batch's own statements."""

    plain: list
    statements: list                 # _Statement, or an int (the plain query it is)


def expand(queries: list, policy) -> Expansion:
    """The batch as plain COUNT statements (see the module docstring)."""
    if not any(map(needs_assembly, queries)):     # plain COUNT statements: as they are
        cancel.check()
        return Expansion(list(queries), list(range(len(queries))))
    plain: list = []
    families: dict = {}
    statements: list = []
    for q in cancel.checked(queries):
        if not needs_assembly(q):
            statements.append(len(plain))
            plain.append(q)
            continue
        st = _Statement(q, [])
        for sub in _subs(q, policy, st):
            st.subs.append(_plain_rows(sub, policy, plain, families))
        statements.append(st)
    return Expansion(plain, statements)


def _and(*preds):
    kept = [p for p in preds if p is not None]
    return None if not kept else kept[0] if len(kept) == 1 else BoolOp("and", tuple(kept))


def _plain_rows(sub: Query, policy, plain: list, families: dict) -> list:
    """Indices of the plain statements a sub-statement's rows come from (one for a count;
    its CDF family for a quantile), appended to ``plain`` unless already there."""
    if sub.quantile is None:
        plain.append(sub)
        return [len(plain) - 1]
    column = sub.quantile.column
    key = (column, sub.where, sub.grouping_sets)
    if key not in families:
        count = replace(sub, quantile=None, target=None, replace=False)
        rows = [replace(count, where=_and(sub.where, Atom(column, op, e)))
                for op in ("<", ">=") for e in _edges(policy.column(column))]
        rows.append(replace(count, count_column=column))
        families[key] = list(range(len(plain), len(plain) + len(rows)))
        plain.extend(rows)
    return families[key]


def _edges(domain) -> list:
    """The interior edges of an integer or numeric column's value units."""
    if domain.type == "integer":
        return [domain.min + k * domain.step for k in range(1, domain.n_value_units)]
    return list(domain.edges[1:-1])


def units_of(domain) -> Units:
    """The value units of an ordered column (spans, values, bounds) for the inversion."""
    n = domain.n_value_units
    if domain.type == "integer":
        first = np.array([domain.min + k * domain.step for k in range(n)], dtype=float)
        last = np.minimum(first + domain.step - 1, domain.max)
        return Units(first - 0.5, last + 0.5, first, float(domain.min), float(domain.max))
    edges = np.array([float(e) for e in domain.edges])
    return Units(edges[:-1], edges[1:], edges[:-1], float(domain.min), float(domain.max))


# ---------------------------------------------------------------------- public groups


def _subs(q: Query, policy, st: _Statement) -> list:
    """The statement itself (no public GROUP BY), or one statement per grouping set and
    combination of its public columns' groups; fills ``st``'s layout and keys."""
    if not q.derived:
        return [q]
    derived = {d.name: d for d in q.derived}
    subs: list = []
    st.layout = []
    sources = [s for s, _ in q.key_columns]
    for gs in q.grouping_sets:
        public = [c for c in gs if c in derived]
        own = tuple(c for c in gs if c not in derived)
        sizes = [len(derived[c].values) if c in derived else
                 len(policy.column(c).group_units()) for c in gs]
        combos = list(itertools.product(*(range(len(derived[c].values)) for c in public)))
        first = len(subs)
        if first + len(combos) > MAX_EXPANSION:
            raise UnsupportedQueryError(
                f"statement {q.index + 1} groups by public columns with more than "
                f"{MAX_EXPANSION:,} combinations of groups; group by fewer of them")
        for combo in combos:
            atoms = [_group_atom(derived[c], g, policy) for c, g in zip(public, combo)]
            subs.append(replace(q, where=_and(q.where, *atoms), grouping_sets=(own,),
                                key_columns=tuple((c, c) for c in own), derived=(),
                                target=None, replace=False))
        gid = sum(1 << (len(sources) - 1 - i) for i, s in enumerate(sources) if s not in gs)
        for cell in cancel.checked(itertools.product(*(range(n) for n in sizes)), 4096):
            at = dict(zip(gs, cell))
            sub = _c_order([at[c] for c in public], [len(derived[c].values) for c in public])
            row = _c_order([at[c] for c in own], [n for c, n in zip(gs, sizes) if c in own])
            st.layout.append((first + sub, row))
            st.keys.append({c: derived[c].values[at[c]] for c in public})
            st.gids.append(gid)
    return subs


def _c_order(coords: list, sizes: list) -> int:
    index = 0
    for c, n in zip(coords, sizes):
        index = index * n + c
    return index


def _group_atom(d, g: int, policy) -> Atom:
    """The key column's units whose public value is group ``g``."""
    truth = tuple(TRUE if k == g else FALSE for k in d.unit_group)
    if len(truth) != policy.column(d.key).n_units:
        raise UnsupportedQueryError(f"the public groups of {d.name!r} do not match the "
                                    f"declared units of {d.key!r}; protect the table again")
    return Atom(d.key, "units", truth)


# ---------------------------------------------------------------------- after compiling


def assemble(workload, expansion: Expansion, policy):
    """The compiled workload with each statement's output (plain ones unchanged)."""
    outs = workload.outputs
    if all(isinstance(s, int) for s in expansion.statements):
        return workload
    final = [outs[s] if isinstance(s, int) else _assembled(s, outs, policy)
             for s in expansion.statements]
    return replace(workload, outputs=tuple(final))


def _sub_rows(indices: list, outs) -> np.ndarray:
    """W rows of a sub-statement: (R,) for a count, (R, 2K-1) for a quantile's family."""
    cols = [np.arange(outs[p].start, outs[p].stop) for p in indices]
    return cols[0] if len(cols) == 1 else np.stack(cols, axis=1)


def _assembled(st: _Statement, outs, policy) -> Assembled:
    q = st.query
    per_sub = [_sub_rows(ix, outs) for ix in st.subs]
    base = outs[st.subs[0][0]]
    if st.layout is None:
        rows, keys, gids = per_sub[0], base.keys, base.grouping_ids
    else:
        rows = np.array([per_sub[s][r] for s, r in st.layout]).reshape(
            (len(st.layout),) + per_sub[0].shape[1:])
        keys = tuple(_key_row(q, outs[st.subs[s][0]], r, public)
                     for (s, r), public in zip(st.layout, st.keys))
        gids = tuple(st.gids) if len(q.grouping_sets) > 1 else None
    derived = {d.name: d.sql_type for d in q.derived}
    units = units_of(policy.column(q.quantile.column)) if q.quantile is not None else None
    span = rows.reshape(-1)
    return Assembled(q, int(span.min()) if span.size else 0,
                     int(span.max()) + 1 if span.size else 0,
                     tuple(o for _, o in q.key_columns), tuple(s for s, _ in q.key_columns),
                     tuple(keys), gids, rows,
                     tuple(derived.get(s) for s, _ in q.key_columns), units,
                     float(q.quantile.q) if q.quantile is not None else math.nan,
                     q.quantile.kind if q.quantile is not None else None)


def _key_row(q: Query, out, r: int, public: dict) -> tuple:
    """One result row's keys: public groups' values, the sub-statement's own keys, else
    None (rolled up)."""
    own = dict(zip(out.key_sources, out.keys[r]))
    return tuple(public[s] if s in public else own.get(s) for s, _ in q.key_columns)
