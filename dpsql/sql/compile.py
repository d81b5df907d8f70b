"""Compile parsed queries onto cells of the declared domain: the workload matrix ``W``.

Pure function of (queries, policy): nothing here reads data (DESIGN.md, step 2).

1. Every atomic condition of the batch is evaluated on every *unit* of its column's declared
   domain (see :mod:`dpsql.workload.domain`), then every maximal one-column sub-condition (e.g.
   ``age < 30 OR age >= 60``) in Kleene logic; a GROUP BY column also separates each of
   its groups, and ``COUNT(col)`` separates NULL.
2. Units on which all of these agree are merged: each used column is cut into the coarsest
   partition that expresses every query this way (its *parts*).
3. The cells are the product of the parts over the columns the batch uses, in C order
   (first used column varies slowest). Unused columns are summed out.
4. Each query, and each group of a GROUP BY, is one row of ``W`` (scipy CSR): 1 on the cells
   its predicate selects (three-valued logic: only TRUE selects), 0 elsewhere.

A compiled :class:`Workload` is immutable: ``W`` is in canonical CSR form with read-only
arrays, and keys are tuples, so one compiled batch can be shared (:mod:`dpsql.sql.memo`)
and named by the exact bytes of ``W`` (:func:`workload_hash`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.workload.domain import FALSE, TRUE, NotExpressible
from dpsql.errors import UnsupportedQueryError
from dpsql.workload import limits as planning
from dpsql.sql.parse import Atom, Const, Predicate, Query

#: the largest number of cells one batch may use (the product of the parts)
MAX_CELLS = 4_000_000
#: the largest number of non-zeros of W
MAX_NONZEROS = 50_000_000


@dataclass(frozen=True)
class ColumnPartition:
    """How one used column's units are merged into parts."""

    column: str
    unit_to_part: np.ndarray   # int64, one entry per unit
    n_parts: int
    part_units: tuple          # tuple of tuples of units, per part


@dataclass(frozen=True)
class Output:
    """Where one statement's answers sit in ``W``, and their group keys."""

    query: Query
    start: int                 # first row in W
    stop: int                  # one past the last row
    key_columns: tuple         # output names of the key columns
    key_sources: tuple         # source columns of the key columns
    keys: tuple                # per row: tuple of key values (None when rolled up or NULL)
    grouping_ids: tuple | None  # per row, when the statement has several grouping sets


@dataclass(frozen=True)
class Workload:
    """A compiled batch: the cells, ``W`` and where each statement's rows are."""

    table: str
    partitions: tuple          # ColumnPartition per used column
    W: sp.csr_matrix
    outputs: tuple             # Output per statement

    @property
    def shape(self) -> tuple:
        return tuple(p.n_parts for p in self.partitions)

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.partitions else 1

    @property
    def n_queries(self) -> int:
        return self.W.shape[0]


def _columns(pred: Predicate) -> frozenset:
    if isinstance(pred, Const):
        return frozenset()
    if isinstance(pred, Atom):
        return frozenset((pred.column,))
    return frozenset().union(*(_columns(c) for c in pred.children))


def _single_column_parts(pred: Predicate | None, negated: bool = False):
    """Maximal sub-conditions that mention exactly one column, and whether a NOT is above.

    Units only need to be told apart when such a sub-condition differs on them: e.g.
    ``age BETWEEN 30 AND 39 OR age >= 60`` separates two kinds of ages, not four. With no
    NOT above it, UNKNOWN and FALSE act alike (AND/OR in Kleene's strong logic: a result that
    is TRUE with an UNKNOWN input is TRUE for either substitution), so only TRUE vs not-TRUE
    needs to be kept.
    """
    if pred is None or isinstance(pred, Const):
        return
    cols = _columns(pred)
    if len(cols) == 1:
        yield next(iter(cols)), pred, negated
        return
    for child in pred.children:
        yield from _single_column_parts(child, negated or pred.op == "not")


def _kleene(pred: Predicate, atom_truth: dict) -> np.ndarray:
    """Truth per unit of a one-column condition (atoms' unit vectors combined)."""
    if isinstance(pred, Atom):
        return atom_truth[_key(pred)]
    if isinstance(pred, Const):
        return np.int8(TRUE if pred.value else FALSE)
    if pred.op == "not":
        return (TRUE - _kleene(pred.children[0], atom_truth)).astype(np.int8)
    return _combine(pred.op, [_kleene(c, atom_truth) for c in pred.children])


def _combine(op: str, vals: list) -> np.ndarray:
    """Kleene AND (min) / OR (max) over truth arrays (FALSE=0 < UNKNOWN=1 < TRUE=2)."""
    out = vals[0]
    for v in vals[1:]:
        out = np.minimum(out, v) if op == "and" else np.maximum(out, v)
    return out


def _atoms(pred: Predicate | None):
    if pred is None or isinstance(pred, Const):
        return
    if isinstance(pred, Atom):
        yield pred
        return
    for child in pred.children:
        yield from _atoms(child)


def _key(atom: Atom) -> tuple:
    """Atoms equal but for their position in the text share one truth vector."""
    return (atom.column, atom.op, atom.value)


def _atom_truth(atom: Atom, domain) -> np.ndarray:
    """Truth of one atom on each unit of its column, or an error pointing at the atom."""
    try:
        if atom.op == "isnull":
            return domain.is_null()
        return domain.compare(atom.op, atom.value)
    except NotExpressible as exc:
        raise UnsupportedQueryError(
            f"condition on column {atom.column!r} cannot be answered on its declared domain: "
            f"{exc}", atom.line, atom.col) from None


@planning.refuse_out_of_memory
def compile_workload(queries: list[Query], policy) -> Workload:
    """Build cells and ``W`` for a batch (all statements on ``policy``'s table)."""
    tables = {q.table for q in queries}
    if len(tables) != 1:
        raise UnsupportedQueryError(
            f"a batch must query one protected table; this one queries {sorted(tables)} "
            "(submit one batch per table)")
    # 1. per column: atoms, grouping, COUNT(col)
    atom_truth: dict[tuple, np.ndarray] = {}
    # one-column sub-conditions -> truth per unit; key (condition, under a NOT)
    unit_truth: dict[tuple, np.ndarray] = {}
    used: list[str] = []
    grouped: set[str] = set()

    def use(c: str) -> None:
        if c not in used:
            used.append(c)

    for q in queries:
        for a in _atoms(q.where):
            use(a.column)
            if _key(a) not in atom_truth:
                atom_truth[_key(a)] = _atom_truth(a, policy.column(a.column))
        for c, sub, negated in _single_column_parts(q.where):
            if (sub, negated) not in unit_truth:
                n_units = policy.column(c).n_units
                truth = np.broadcast_to(_kleene(sub, atom_truth), (n_units,))
                if not negated:
                    truth = np.where(truth == TRUE, TRUE, FALSE).astype(np.int8)
                unit_truth[(sub, negated)] = truth
        if q.count_column is not None:
            use(q.count_column)
        for gs in q.grouping_sets:
            for c in gs:
                use(c)
                grouped.add(c)
    used.sort(key=policy.column_names.index)

    # 2. coarsest partition per column
    partitions = []
    for c in used:
        dom = policy.column(c)
        columns = [t for (sub, _), t in unit_truth.items() if _columns(sub) == {c}]
        if any(q.count_column == c for q in queries):
            columns.append(dom.is_null())
        if c in grouped:
            gid = np.full(dom.n_units, -1, dtype=np.int64)
            gid[dom.group_units()] = np.arange(len(dom.group_units()))
            columns.append(gid)
        sig = np.stack(columns, axis=1) if columns else np.zeros((dom.n_units, 1))
        _, first, inverse = np.unique(sig, axis=0, return_index=True, return_inverse=True)
        # number parts in order of their first unit
        planning.check_grouping(c, dom.n_units, len(first))
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        unit_to_part = rank[inverse.reshape(-1)].astype(np.int64)
        part_units = tuple(tuple(np.flatnonzero(unit_to_part == p).tolist())
                           for p in range(len(order)))
        unit_to_part.flags.writeable = False
        partitions.append(ColumnPartition(c, unit_to_part, len(order), part_units))
    shape = tuple(p.n_parts for p in partitions)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n > MAX_CELLS:
        raise UnsupportedQueryError(
            f"this batch needs {n:,} cells (parts per column: "
            + ", ".join(f"{p.column}={p.n_parts}" for p in partitions)
            + f"), more than the limit of {MAX_CELLS:,}; split the batch or use fewer columns")
    index = {p.column: i for i, p in enumerate(partitions)}

    def broadcast(col: str, per_part: np.ndarray) -> np.ndarray:
        shp = [1] * len(shape)
        shp[index[col]] = shape[index[col]]
        return per_part.reshape(shp)

    def part_truth(sub: Predicate, negated: bool) -> np.ndarray:
        c = next(iter(_columns(sub)))
        p = partitions[index[c]]
        first_units = np.array([u[0] for u in p.part_units])
        return broadcast(c, unit_truth[(sub, negated)][first_units])

    def evaluate(pred: Predicate | None, negated: bool = False) -> np.ndarray:
        """Truth per cell; one-column sub-conditions are constant on each part."""
        if pred is None:
            return np.full(shape, TRUE, dtype=np.int8)
        if isinstance(pred, Const):
            return np.full(shape, TRUE if pred.value else FALSE, dtype=np.int8)
        if len(_columns(pred)) == 1:
            return np.broadcast_to(part_truth(pred, negated), shape)
        if pred.op == "not":
            return (TRUE - evaluate(pred.children[0], True)).astype(np.int8)
        out = _combine(pred.op, [evaluate(ch, negated) for ch in pred.children])
        return np.broadcast_to(out, shape)

    # 3. rows of W
    rows_idx, cols_idx = [], []
    outputs = []
    m = 0
    for q in queries:
        mask = evaluate(q.where) == TRUE
        if q.count_column is not None:
            dom = policy.column(q.count_column)
            p = partitions[index[q.count_column]]
            notnull = (TRUE - dom.is_null())[[u[0] for u in p.part_units]]
            mask = mask & (broadcast(q.count_column, notnull) == TRUE)
        mask = np.broadcast_to(mask, shape).reshape(-1)
        selected = np.flatnonzero(mask)
        key_sources = tuple(s for s, _ in q.key_columns)
        keys: list = []
        gids: list = []
        start = m
        for gs in q.grouping_sets:
            group_index = np.zeros(shape, dtype=np.int64)
            n_groups = 1
            valid = np.ones(shape, dtype=bool)
            per_col_groups = []
            for c in gs:
                dom = policy.column(c)
                p = partitions[index[c]]
                gunits = dom.group_units()
                pos = np.full(p.n_parts, -1, dtype=np.int64)
                for gpos, u in enumerate(gunits):
                    pos[p.unit_to_part[u]] = gpos
                b = broadcast(c, pos)
                valid = valid & (b >= 0)
                group_index = group_index * len(gunits) + np.maximum(b, 0)
                n_groups *= len(gunits)
                per_col_groups.append([dom.group_key(u) for u in gunits])
            gi = np.broadcast_to(group_index, shape).reshape(-1)[selected]
            ok = np.broadcast_to(valid, shape).reshape(-1)[selected]
            rows_idx.append(m + gi[ok])
            cols_idx.append(selected[ok])
            # keys in row order (C order over the grouping set's columns)
            gid = sum(1 << (len(key_sources) - 1 - i)
                      for i, s in enumerate(key_sources) if s not in gs)
            for combo in _product(per_col_groups):
                value = dict(zip(gs, combo))
                keys.append(tuple(value.get(s) for s in key_sources))
                gids.append(gid)
            m += n_groups
        outputs.append(Output(q, start, m, tuple(o for _, o in q.key_columns), key_sources,
                              tuple(keys), tuple(gids) if len(q.grouping_sets) > 1 else None))
    rows = np.concatenate(rows_idx) if rows_idx else np.zeros(0, dtype=np.int64)
    cols = np.concatenate(cols_idx) if cols_idx else np.zeros(0, dtype=np.int64)
    if len(rows) > MAX_NONZEROS:
        raise UnsupportedQueryError(
            f"this batch's workload has {len(rows):,} non-zeros, more than the limit of "
            f"{MAX_NONZEROS:,}; split the batch")
    W = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, n))
    W.sum_duplicates()                       # canonical form (a no-op from COO)
    for a in (W.data, W.indices, W.indptr):
        a.flags.writeable = False
    return Workload(policy.table, tuple(partitions), W, tuple(outputs))


def workload_hash(W) -> str:
    """SHA-256 of the exact bytes of a workload in canonical CSR form (shape, row pointers
    and column indices as int64, values as float64): the name of ``W`` in the caches."""
    M = sp.csr_matrix(W)
    if not M.has_canonical_format:
        M = M.copy()
        M.sum_duplicates()
    h = hashlib.sha256()
    h.update(json.dumps(["csr", int(M.shape[0]), int(M.shape[1])]).encode())
    for part in (M.indptr.astype(np.int64, copy=False), M.indices.astype(np.int64, copy=False),
                 M.data.astype(np.float64, copy=False)):
        h.update(np.ascontiguousarray(part).tobytes())
        h.update(b"|")
    return h.hexdigest()


def _product(lists):
    if not lists:
        yield ()
        return
    yield from itertools.product(*lists)


def query_columns(q: Query) -> frozenset:
    """Every column a query reads: its predicate, its grouping sets and COUNT(col)."""
    cols = set(_columns(q.where)) if q.where is not None else set()
    for gs in q.grouping_sets:
        cols.update(gs)
    if q.count_column is not None:
        cols.add(q.count_column)
    return frozenset(cols)


def compile_blocks(queries: list[Query], policy) -> list[tuple[Workload, tuple]]:
    """The batch split into independent blocks: groups of columns that no query spans.

    Two columns are in one block when some query reads both (connected components). A query
    that reads no column (``COUNT(*)`` of the whole table) joins the first block. Each block
    is compiled on its own columns only, so its cells are the product of *its* columns'
    parts; returns ``(workload, statement indices)`` per block, blocks in order of their
    first statement. This is the factored representation of MWEM (Hardt, Ligett & McSherry,
    §4): a product distribution over the blocks answers every query.
    """
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        while parent.setdefault(c, c) != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for q in queries:
        cols = sorted(query_columns(q))
        for c in cols[1:]:
            parent[find(c)] = find(cols[0])
        if cols:
            find(cols[0])
    blocks: dict[str, list[int]] = {}
    loose: list[int] = []
    for i, q in enumerate(queries):
        cols = query_columns(q)
        if cols:
            blocks.setdefault(find(next(iter(cols))), []).append(i)
        else:
            loose.append(i)
    groups = list(blocks.values()) or [[]]
    groups[0] = sorted(groups[0] + loose)
    groups.sort(key=lambda g: g[0])
    return [(compile_workload([queries[i] for i in g], policy), tuple(g)) for g in groups]
