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

import functools
import hashlib
import itertools
import json
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql import cancel

from dpsql.workload.units import FALSE, TRUE
from dpsql.errors import UnsupportedQueryError
from dpsql.workload import limits as planning
from dpsql.sql.conditions import (_atom_truth, _atoms, _broadcast, _columns, _combine, _key,
                                  _kleene, _single_column_parts)
from dpsql.sql.expand import assemble, expand
from dpsql.sql.ir import Const, Predicate, Query

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


@dataclass(frozen=True)
class Parts:
    """Steps 1–2 of a batch: each used column's partition and the one-column conditions'
    truth per unit (shared by the dense compile and :mod:`dpsql.sql.implicit`)."""

    partitions: tuple          # ColumnPartition per used column, in policy column order
    unit_truth: dict           # (one-column condition, under a NOT) -> truth per unit

    @property
    def shape(self) -> tuple:
        return tuple(p.n_parts for p in self.partitions)

    @property
    def n_cells(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def index(self) -> dict:
        return {p.column: i for i, p in enumerate(self.partitions)}

    @functools.cached_property
    def _first_units(self) -> dict:     # each part's first unit, per column (asked per query)
        return {p.column: np.array([u[0] for u in p.part_units]) for p in self.partitions}

    def part_truth(self, sub: Predicate, negated: bool = False, column=None) -> np.ndarray:
        """Truth of a one-column condition on each part of its column (constant on a part)."""
        c = next(iter(_columns(sub))) if column is None else column
        return self.unit_truth[(sub, negated)][self._first_units[c]]


def _check_one_table(queries: list[Query]) -> None:
    tables = {q.table for q in queries}
    if len(tables) != 1:
        raise UnsupportedQueryError(
            f"a batch must query one protected table; this one queries {sorted(tables)} "
            "(submit one batch per table)")


def _conditions(queries: list[Query], policy) -> tuple[list, set, dict]:
    """Step 1: the used columns (policy order), the grouped ones, and each one-column
    sub-condition's truth per unit (Kleene; TRUE vs not-TRUE unless under a NOT)."""
    atom_truth: dict[tuple, np.ndarray] = {}
    unit_truth: dict[tuple, np.ndarray] = {}
    used: set[str] = set()
    grouped: set[str] = set()
    for q in cancel.checked(queries):
        for a in _atoms(q.where):
            used.add(a.column)
            if _key(a) not in atom_truth:
                atom_truth[_key(a)] = _atom_truth(a, policy.column(a.column))
        for c, sub, negated in _single_column_parts(q.where):
            if (sub, negated) not in unit_truth:
                n_units = policy.column(c).n_units
                truth = _broadcast(_kleene(sub, atom_truth), (n_units,))
                if not negated:
                    truth = np.where(truth == TRUE, TRUE, FALSE).astype(np.int8)
                unit_truth[(sub, negated)] = truth
        if q.count_column is not None:
            used.add(q.count_column)
        for gs in q.grouping_sets:
            used.update(gs)
            grouped.update(gs)
    return sorted(used, key=policy.column_names.index), grouped, unit_truth


def _partition(c: str, dom, signature: list) -> ColumnPartition:
    """Step 2 for one column: units with equal signatures merge into one part (parts
    numbered in order of their first unit)."""
    sig = np.ascontiguousarray(np.stack(signature, axis=1) if signature
                               else np.zeros((dom.n_units, 1)))
    seen: dict = {}             # a signature's bytes -> its part: 4-10x np.unique(axis=0)
    unit_to_part = np.fromiter((seen.setdefault(row.tobytes(), len(seen)) for row in sig),
                               dtype=np.int64, count=sig.shape[0])
    planning.check_grouping(c, dom.n_units, len(seen))
    units = np.argsort(unit_to_part, kind="stable")
    part_units = tuple(tuple(u.tolist()) for u in
                       np.split(units, np.cumsum(np.bincount(unit_to_part))[:-1]))
    unit_to_part.flags.writeable = False
    return ColumnPartition(c, unit_to_part, len(seen), part_units)


def compile_parts(queries: list[Query], policy) -> Parts:
    """Steps 1–2: the coarsest partition of every used column (no cells, no ``W``)."""
    _check_one_table(queries)
    used, grouped, unit_truth = _conditions(queries, policy)
    partitions = []
    for c in used:
        dom = policy.column(c)
        signature = [t for (sub, _), t in unit_truth.items() if _columns(sub) == {c}]
        if any(q.count_column == c for q in queries):
            signature.append(dom.is_null())
        if c in grouped:
            gid = np.full(dom.n_units, -1, dtype=np.int64)
            gid[dom.group_units()] = np.arange(len(dom.group_units()))
            signature.append(gid)
        partitions.append(_partition(c, dom, signature))
    return Parts(tuple(partitions), unit_truth)


def group_rows(policy, parts: Parts, gs: tuple) -> tuple[list, list]:
    """Per column of a grouping set (in ``gs`` order): each part's group position (-1 when
    the part is no group: implicit ``other``/NULL not returned), and the group keys."""
    positions, keys = [], []
    for c in gs:
        dom = policy.column(c)
        p = parts.partitions[parts.index[c]]
        gunits = dom.group_units()
        pos = np.full(p.n_parts, -1, dtype=np.int64)
        for gpos, u in enumerate(gunits):
            pos[p.unit_to_part[u]] = gpos
        positions.append(pos)
        keys.append([dom.group_key(u) for u in gunits])
    return positions, keys


def output_keys(q: Query, gs: tuple, per_col_keys: list) -> tuple[list, int]:
    """The key tuples of one grouping set's rows (C order over ``gs``) and its grouping id."""
    key_sources = tuple(s for s, _ in q.key_columns)
    gid = sum(1 << (len(key_sources) - 1 - i) for i, s in enumerate(key_sources) if s not in gs)
    keys = []
    for combo in cancel.checked(_product(per_col_keys), every=4096):
        value = dict(zip(gs, combo))
        keys.append(tuple(value.get(s) for s in key_sources))
    return keys, gid


def make_output(q: Query, start: int, stop: int, keys: list, gids: list) -> Output:
    return Output(q, start, stop, tuple(o for _, o in q.key_columns),
                  tuple(s for s, _ in q.key_columns), tuple(keys),
                  tuple(gids) if len(q.grouping_sets) > 1 else None)


class _Cells:
    """Truth of conditions on the dense cell product (C order over the used columns)."""

    def __init__(self, parts: Parts):
        self.parts, self.shape, self.index = parts, parts.shape, parts.index

    def broadcast(self, col: str, per_part: np.ndarray) -> np.ndarray:
        shp = [1] * len(self.shape)
        shp[self.index[col]] = self.shape[self.index[col]]
        return per_part.reshape(shp)

    def evaluate(self, pred: Predicate | None, negated: bool = False) -> np.ndarray:
        """Truth per cell; one-column sub-conditions are constant on each part."""
        shape = self.shape
        if pred is None:
            return np.full(shape, TRUE, dtype=np.int8)
        if isinstance(pred, Const):
            return np.full(shape, TRUE if pred.value else FALSE, dtype=np.int8)
        cols = _columns(pred)
        if len(cols) == 1:
            c = next(iter(cols))
            return _broadcast(self.broadcast(c, self.parts.part_truth(pred, negated, c)),
                              shape)
        if pred.op == "not":
            return (TRUE - self.evaluate(pred.children[0], True)).astype(np.int8)
        out = _combine(pred.op, [self.evaluate(ch, negated) for ch in pred.children])
        return _broadcast(out, shape)

    def selected(self, q: Query, policy) -> np.ndarray:
        """Indices of the cells a query counts (its WHERE, and COUNT(col) not NULL)."""
        mask = self.evaluate(q.where) == TRUE
        if q.count_column is not None:
            dom = policy.column(q.count_column)
            p = self.parts.partitions[self.index[q.count_column]]
            notnull = (TRUE - dom.is_null())[[u[0] for u in p.part_units]]
            mask = mask & (self.broadcast(q.count_column, notnull) == TRUE)
        return np.flatnonzero(_broadcast(mask, self.shape).reshape(-1))


def _check_cells(parts: Parts) -> None:
    if parts.n_cells > MAX_CELLS:
        raise UnsupportedQueryError(
            f"this batch needs {parts.n_cells:,} cells (parts per column: "
            + ", ".join(f"{p.column}={p.n_parts}" for p in parts.partitions)
            + f"), more than the limit of {MAX_CELLS:,}; split the batch or use fewer columns")


def _query_rows(q: Query, policy, cells: _Cells, m: int):
    """(row indices, cell indices, Output) of one statement's rows of ``W`` from row ``m``."""
    shape = cells.shape
    selected = cells.selected(q, policy)
    rows, cols, keys, gids = [], [], [], []
    start = m
    for gs in q.grouping_sets:
        positions, per_col_keys = group_rows(policy, cells.parts, gs)
        group_index = np.zeros(shape, dtype=np.int64)
        valid = np.ones(shape, dtype=bool)
        for c, pos in zip(gs, positions):
            b = cells.broadcast(c, pos)
            valid = valid & (b >= 0)
            group_index = group_index * len(per_col_keys[gs.index(c)]) + np.maximum(b, 0)
        gi = _broadcast(group_index, shape).reshape(-1)[selected]
        ok = _broadcast(valid, shape).reshape(-1)[selected]
        rows.append(m + gi[ok])
        cols.append(selected[ok])
        set_keys, gid = output_keys(q, gs, per_col_keys)
        keys += set_keys
        gids += [gid] * len(set_keys)
        m += len(set_keys)
    return rows, cols, make_output(q, start, m, keys, gids)


@planning.refuse_out_of_memory
def compile_workload(queries: list[Query], policy) -> Workload:
    """Build cells and ``W`` for a batch (all statements on ``policy``'s table): the dense
    form, on the full product of the used columns' parts. Quantiles and GROUP BY on public
    columns are counts of the same batch (:mod:`dpsql.sql.expand`)."""
    batch = expand(queries, policy)
    parts = compile_parts(batch.plain, policy)
    return assemble(dense_workload(batch.plain, policy, parts), batch, policy)


def dense_workload(queries: list[Query], policy, parts: Parts) -> Workload:
    """Step 3: ``W`` on the product of ``parts`` (refused above :data:`MAX_CELLS` cells)."""
    _check_cells(parts)
    cells = _Cells(parts)
    rows_idx, cols_idx, outputs, m = [], [], [], 0
    for q in cancel.checked(queries):
        rows, cols, out = _query_rows(q, policy, cells, m)
        rows_idx += rows
        cols_idx += cols
        outputs.append(out)
        m = out.stop
    rows = np.concatenate(rows_idx) if rows_idx else np.zeros(0, dtype=np.int64)
    cols = np.concatenate(cols_idx) if cols_idx else np.zeros(0, dtype=np.int64)
    if len(rows) > MAX_NONZEROS:
        raise UnsupportedQueryError(
            f"this batch's workload has {len(rows):,} non-zeros, more than the limit of "
            f"{MAX_NONZEROS:,}; split the batch")
    W = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, parts.n_cells))
    W.sum_duplicates()                       # canonical form (a no-op from COO)
    for a in (W.data, W.indices, W.indptr):
        a.flags.writeable = False
    return Workload(policy.table, parts.partitions, W, tuple(outputs))


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
