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
import json
import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dpsql import cancel

from dpsql.workload.units import FALSE, TRUE
from dpsql.errors import UnsupportedQueryError
from dpsql.workload import limits as planning
from dpsql.sql.conditions import (_atom_truth, _atoms, _broadcast, _columns, _key,
                                  _kleene, _single_column_parts)
from dpsql.sql import grouped
from dpsql.sql.cells import statement_rows
from dpsql.sql.expand import assemble, expand
from dpsql.sql.ir import Predicate, Query

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
    #: id(statement) -> (statement, its WHERE's shape) (:func:`dpsql.sql.grouped.shape`), as
    #: step 1 found them (step 3 asks again; a statement not here has its shape computed)
    shapes: dict = field(default_factory=dict, compare=False, repr=False)

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
    def first_units(self) -> dict:      # each part's first unit, per column (asked per query)
        return {p.column: np.array([u[0] for u in p.part_units]) for p in self.partitions}

    @functools.cached_property
    def unit_parts(self) -> frozenset:  # columns whose parts are their units, in order
        return frozenset(p.column for p in self.partitions if p.n_parts == len(p.unit_to_part)
                         and np.array_equal(self.first_units[p.column], np.arange(p.n_parts)))

    def part_truth(self, sub: Predicate, negated: bool = False, column=None) -> np.ndarray:
        """Truth of a one-column condition on each part of its column (constant on a part)."""
        c = next(iter(_columns(sub))) if column is None else column
        return self.unit_truth[(sub, negated)][self.first_units[c]]


def _check_one_table(queries: list[Query]) -> None:
    tables = {q.table for q in queries}
    if len(tables) != 1:
        raise UnsupportedQueryError(
            f"a batch must query one protected table; this one queries {sorted(tables)} "
            "(submit one batch per table)")


def _conditions(queries: list[Query], policy,
                of: dict | None = None) -> tuple[list, set, dict]:
    """Step 1: the used columns (policy order), the grouped ones, and each one-column
    sub-condition's truth per unit (Kleene; TRUE vs not-TRUE unless under a NOT): shape by
    shape (:mod:`dpsql.sql.grouped`; ``of``: see :func:`grouped.groups`), or statement by
    statement when a condition fails (to raise the first statement's error)."""
    shapes = grouped.groups(queries, of)
    used: set[str] = set().union(*(grouped.shape_columns(sh) for sh in shapes if sh))
    grouped_columns: set[str] = set()
    for count_column, sets in {(q.count_column, q.grouping_sets) for q in queries}:
        if count_column is not None:
            used.add(count_column)
        for gs in sets:
            used.update(gs)
            grouped_columns.update(gs)
    unit_truth = grouped.conditions(shapes, policy)
    if unit_truth is None:
        unit_truth = unit_truth_per_statement(queries, policy)
    return sorted(used, key=policy.column_names.index), grouped_columns, unit_truth


def unit_truth_per_statement(queries: list[Query], policy) -> dict:
    """Step 1's truth per unit, statement by statement (the definition :mod:`grouped`
    follows; it raises the first statement's error)."""
    atom_truth: dict[tuple, np.ndarray] = {}
    unit_truth: dict[tuple, np.ndarray] = {}
    for q in cancel.checked(queries):
        for a in _atoms(q.where):
            if _key(a) not in atom_truth:
                atom_truth[_key(a)] = _atom_truth(a, policy.column(a.column))
        for c, sub, negated in _single_column_parts(q.where):
            if (sub, negated) not in unit_truth:
                n_units = policy.column(c).n_units
                truth = _broadcast(_kleene(sub, atom_truth), (n_units,))
                if not negated:
                    truth = np.where(truth == TRUE, TRUE, FALSE).astype(np.int8)
                unit_truth[(sub, negated)] = truth
    return unit_truth


def _partition(c: str, dom, signature: list) -> ColumnPartition:
    """Step 2 for one column: units with equal signatures merge into one part (parts
    numbered in order of their first unit)."""
    sig = np.ascontiguousarray(np.stack(signature, axis=1) if signature
                               else np.zeros((dom.n_units, 1)))
    seen: dict = {}             # a signature's bytes -> its part: 4-10x np.unique(axis=0)
    unit_to_part = np.fromiter((seen.setdefault(row.tobytes(), len(seen)) for row in sig),
                               dtype=np.int64, count=sig.shape[0])
    planning.check_grouping(c, dom.n_units, len(seen))
    units = np.argsort(unit_to_part, kind="stable").tolist()
    ends = np.cumsum(np.bincount(unit_to_part)).tolist()    # each part's units, in order
    part_units = tuple(tuple(units[a:b]) for a, b in zip([0] + ends[:-1], ends))
    unit_to_part.flags.writeable = False
    return ColumnPartition(c, unit_to_part, len(seen), part_units)


def compile_parts(queries: list[Query], policy) -> Parts:
    """Steps 1–2: the coarsest partition of every used column (no cells, no ``W``)."""
    _check_one_table(queries)
    shapes: dict = {}
    used, grouped_columns, unit_truth = _conditions(queries, policy, shapes)
    partitions = []
    by_column: dict = {}               # every key is a one-column condition
    for (sub, _), t in unit_truth.items():
        by_column.setdefault(grouped.first_column(sub), []).append(t)
    for c in used:
        dom = policy.column(c)
        signature = list(by_column.get(c, ()))
        if any(q.count_column == c for q in queries):
            signature.append(dom.is_null())
        if c in grouped_columns:
            gid = np.full(dom.n_units, -1, dtype=np.int64)
            gid[dom.group_units()] = np.arange(len(dom.group_units()))
            signature.append(gid)
        partitions.append(_partition(c, dom, signature))
    return Parts(tuple(partitions), unit_truth, shapes)


def _check_cells(parts: Parts) -> None:
    if parts.n_cells > MAX_CELLS:
        raise UnsupportedQueryError(
            f"this batch needs {parts.n_cells:,} cells (parts per column: "
            + ", ".join(f"{p.column}={p.n_parts}" for p in parts.partitions)
            + f"), more than the limit of {MAX_CELLS:,}; split the batch or use fewer columns")


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
    rows_idx, cols_idx, outputs, m = statement_rows(queries, policy, parts)
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
