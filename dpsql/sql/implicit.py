"""Compile a batch onto a union of Kronecker blocks instead of the full cell product.

Pure function of (queries, policy), like :mod:`dpsql.sql.compile` (whose steps 1–2, the
columns' parts, it shares). Each grouping set of each statement is one block
(:class:`dpsql.workload.blocks.KronBlock`) with one factor per used column, over that
column's parts:

- a GROUP BY column: one row per declared group (``[I | 0]``-like: parts that are no group,
  the implicit ``other``/NULL, are counted by no row), times the statement's conditions on
  that column;
- a column the statement only filters (WHERE, ``COUNT(col)``): one row, its truth per part;
- any other column: a row of ones.

That needs the WHERE clause to be a conjunction of one-column conditions (``a = 1 AND b < 3``);
a condition joining columns by OR or NOT (``a = 1 OR b = 2``) is not a Kronecker product, and
:class:`NotFactorable` says which statement. The answers of a block come out in C order over
its grouped columns in *policy* order; :attr:`ImplicitWorkload.rows` maps them back to the
statement's own order (C order over the GROUP BY as written), so the result tables equal the
dense path's.

Nothing here allocates anything of the full product's size: the factors are per column.
:data:`DENSE_MAX_CELLS` is where :func:`compile_batch` switches: up to it the dense ``W`` is
built (exact optimisation over every strategy is cheap there); above it, batches over two or
more columns are compiled to blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.compile import (MAX_CELLS, Parts, compile_parts, dense_workload, group_rows,
                               make_output, output_keys)
from dpsql.sql.conditions import _columns
from dpsql.sql.expand import assemble, expand
from dpsql.sql.ir import Const, Predicate, Query
from dpsql.workload import limits as planning
from dpsql.workload.blocks import KronBlock, UnionWorkload
from dpsql.workload.units import TRUE

#: batches whose dense product of parts has more cells than this (over two or more columns)
#: are compiled to Kronecker blocks. The dense selection costs O(n³) in the cells n (its
#: eigen/optimal candidates take seconds at ~1,000 cells and minutes at ~4,000), while the
#: implicit plan is in milliseconds and within a few per cent of the optimum on marginals.
DENSE_MAX_CELLS = 1024
#: the most rows (answers) one implicit batch may have
MAX_ANSWERS = 5_000_000
#: the most cells one clique's marginal may have (the engine returns it, the plan reads it)
MAX_CLIQUE_CELLS = 1 << 22


class NotFactorable(Exception):
    """A statement whose rows are not one Kronecker product per grouping set."""


@dataclass(frozen=True)
class BlockRows:
    """Where a block's answers go: rows ``start..start+len(order)`` of the batch, row
    ``start + k`` being the block's answer ``order[k]``."""

    block: int
    start: int
    order: np.ndarray


@dataclass(frozen=True)
class ImplicitWorkload:
    """A compiled batch as a union of Kronecker blocks over the used columns' parts."""

    table: str
    partitions: tuple          # ColumnPartition per used column (policy order)
    union: UnionWorkload
    rows: tuple                # BlockRows per block, in row order
    outputs: tuple             # Output per statement (start/stop index the answers)
    n_queries: int

    implicit = True

    @property
    def shape(self) -> tuple:
        return tuple(p.n_parts for p in self.partitions)

    @property
    def n_cells(self) -> int:
        return math.prod(self.shape)

    def assemble(self, per_block: list) -> np.ndarray:
        """The batch's answers (row order) from each block's answers (block order)."""
        out = np.empty(self.n_queries)
        for r in self.rows:
            out[r.start:r.start + r.order.size] = np.asarray(per_block[r.block])[r.order]
        return out


def _conjuncts(pred: Predicate | None) -> list | None:
    """One-column conditions whose AND is ``pred`` (None: FALSE), else NotFactorable."""
    if pred is None:
        return []
    if isinstance(pred, Const):
        return [] if pred.value else None
    if len(_columns(pred)) == 1:
        return [pred]
    if pred.op != "and":
        raise NotFactorable
    out = []
    for child in pred.children:
        sub = _conjuncts(child)
        if sub is None:
            return None
        out += sub
    return out


def _filters(q: Query, policy, parts: Parts) -> dict | None:
    """Per column: the 0/1 truth per part of everything the statement requires of it."""
    conjuncts = _conjuncts(q.where)
    if conjuncts is None:
        return None
    masks: dict = {}
    for sub in conjuncts:
        c = next(iter(_columns(sub)))
        t = parts.part_truth(sub) == TRUE
        masks[c] = masks[c] & t if c in masks else t
    if q.count_column is not None:
        c = q.count_column
        p = parts.partitions[parts.index[c]]
        notnull = (TRUE - policy.column(c).is_null())[[u[0] for u in p.part_units]] == TRUE
        masks[c] = masks[c] & notnull if c in masks else notnull
    return masks


def _block(q: Query, gs: tuple, masks: dict | None, policy, parts: Parts):
    """(KronBlock, group keys in ``gs`` order, C-order permutation into ``gs`` order)."""
    positions, per_col_keys = group_rows(policy, parts, gs)
    where = dict(zip(gs, positions))
    factors = []
    for k, p in enumerate(parts.partitions):
        mask = np.ones(p.n_parts) if masks is None or p.column not in masks \
            else masks[p.column].astype(float)
        if masks is None and k == 0:
            mask = np.zeros(p.n_parts)           # WHERE FALSE: every count is 0
        if p.column in where:
            pos = where[p.column]
            F = np.zeros((len(per_col_keys[gs.index(p.column)]), p.n_parts))
            parts_in = np.flatnonzero(pos >= 0)
            F[pos[parts_in], parts_in] = mask[parts_in]
        else:
            F = mask.reshape(1, -1)
        factors.append(F)
    block = KronBlock(tuple(factors))
    _check_clique(q, block, parts)
    # rows of the block: C order over gs's columns in policy order; the statement's: gs order
    by_policy = sorted(range(len(gs)), key=lambda k: parts.index[gs[k]])
    counts = [len(per_col_keys[k]) for k in by_policy]
    if math.prod(counts) > MAX_ANSWERS:
        raise UnsupportedQueryError(
            f"statement {q.index + 1} groups by {', '.join(gs)}: {math.prod(counts):,} "
            f"groups, more than the limit of {MAX_ANSWERS:,} answers; split it")
    grid = np.arange(math.prod(counts), dtype=np.int64).reshape(counts)
    order = grid.transpose(np.argsort(by_policy)).reshape(-1)
    return block, per_col_keys, order


def _check_clique(q: Query, block: KronBlock, parts: Parts) -> None:
    cells = math.prod(block.sizes[i] for i in block.used)
    if cells > MAX_CLIQUE_CELLS:
        cols = [parts.partitions[i] for i in block.used]
        raise UnsupportedQueryError(
            f"statement {q.index + 1} reads {len(cols)} columns together ("
            + ", ".join(f"{p.column}={p.n_parts} parts" for p in cols)
            + f"): their marginal has {cells:,} cells, more than the limit of "
            f"{MAX_CLIQUE_CELLS:,} for one block; group by fewer columns in one statement, "
            "or coarsen a column's groups")


def implicit_workload(queries: list[Query], policy, parts: Parts) -> ImplicitWorkload:
    """Step 3 in blocks (raises :class:`NotFactorable` for a statement that is not)."""
    blocks, rows, outputs, m = [], [], [], 0
    for q in queries:
        try:
            masks = _filters(q, policy, parts)
        except NotFactorable:
            raise NotFactorable(q) from None
        keys, gids, start = [], [], m
        for gs in q.grouping_sets:
            block, per_col_keys, order = _block(q, gs, masks, policy, parts)
            rows.append(BlockRows(len(blocks), m, order))
            blocks.append(block)
            set_keys, gid = output_keys(q, gs, per_col_keys)
            keys += set_keys
            gids += [gid] * len(set_keys)
            m += len(set_keys)
            if m > MAX_ANSWERS:
                raise UnsupportedQueryError(
                    f"this batch has more than {MAX_ANSWERS:,} answers (statement "
                    f"{q.index + 1} groups by {', '.join(gs)}); split it into smaller batches")
        outputs.append(make_output(q, start, m, keys, gids))
    union = UnionWorkload(tuple(p.column for p in parts.partitions), parts.shape, tuple(blocks))
    return ImplicitWorkload(policy.table, parts.partitions, union, tuple(rows),
                            tuple(outputs), m)


@planning.refuse_out_of_memory
def compile_batch(queries: list[Query], policy):
    """The batch as a dense :class:`~dpsql.sql.compile.Workload` (small products, one
    column, or statements that are not Kronecker products) or an :class:`ImplicitWorkload`
    (products over two or more columns above :data:`DENSE_MAX_CELLS` cells). Quantiles and
    GROUP BY on public columns are counts of the same batch (:mod:`dpsql.sql.expand`)."""
    batch = expand(queries, policy)
    return assemble(_compile_plain(batch.plain, policy), batch, policy)


def _compile_plain(queries: list[Query], policy):
    """:func:`compile_batch` for COUNT statements over the protected table's columns."""
    parts = compile_parts(queries, policy)
    if parts.n_cells <= DENSE_MAX_CELLS or len(parts.partitions) < 2:
        return dense_workload(queries, policy, parts)
    try:
        return implicit_workload(queries, policy, parts)
    except NotFactorable as exc:
        q = exc.args[0]
        if parts.n_cells <= MAX_CELLS:
            return dense_workload(queries, policy, parts)
        raise UnsupportedQueryError(
            f"statement {q.index + 1} combines columns "
            f"{', '.join(sorted(_columns(q.where)))} with OR/NOT, which the implicit path "
            f"cannot split into per-column factors, and the batch's full product has "
            f"{parts.n_cells:,} cells (limit {MAX_CELLS:,}); submit that statement in a "
            "batch of its own, or rewrite the condition as a conjunction (AND) of "
            "one-column conditions") from None
