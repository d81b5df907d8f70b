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

from dpsql import cancel
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.cells import group_rows, make_output, output_keys
from dpsql.sql.compile import MAX_CELLS, Parts, compile_parts, dense_workload
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
    """Where a block's answers go: row ``target[k]`` of the batch is the block's answer
    ``source[k]`` (statements merged into one block, or repeated, share its answers)."""

    block: int
    target: np.ndarray
    source: np.ndarray


@dataclass(frozen=True)
class ImplicitWorkload:
    """A compiled batch as a union of Kronecker blocks over the used columns' parts."""

    table: str
    partitions: tuple          # ColumnPartition per used column (policy order)
    union: UnionWorkload
    rows: tuple                # BlockRows per block
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
            out[r.target] = np.asarray(per_block[r.block])[r.source]
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


@dataclass
class _Member:
    """One grouping set of one statement: rows ``start..start+count`` of the batch."""

    query: Query
    gs: tuple
    masks: dict | None         # per filtered column, its truth per part (None: WHERE FALSE)
    start: int
    count: int


def _merged(members: list) -> list:
    """Members that share one block: same grouping set and filtered columns, and the same
    conditions on every column but at most one (the *varying* column, whose condition rows
    are stacked into one factor), or WHERE FALSE. ``[(members, varying column or None)]``,
    blocks in order of their first statement; the varying column is the one giving the
    fewest blocks."""
    groups: dict = {}
    for mem in members:
        key = ("false", mem.gs) if mem.masks is None else (mem.gs, frozenset(mem.masks))
        groups.setdefault(key, []).append(mem)
    out = []
    for (gs, cols), group in groups.items():
        if gs == "false":
            out.append((group, None))
            continue
        best = None
        for v in [None] + sorted(c for c in cols if c not in gs):
            split: dict = {}
            for mem in group:
                sig = tuple((c, mem.masks[c].tobytes()) for c in sorted(cols) if c != v)
                split.setdefault(sig, []).append(mem)
            if best is None or len(split) < len(best[0]):
                best = (split, v)
        out += [(sub, best[1]) for sub in best[0].values()]
    return sorted(out, key=lambda g: g[0][0].start)


def _factor(p, mask: np.ndarray, where: dict, keys: dict) -> np.ndarray:
    """One column's factor: grouped rows times the condition, or the condition's rows."""
    if p.column not in where:
        return np.atleast_2d(mask).astype(float)
    pos = where[p.column]
    F = np.zeros((len(keys[p.column]), p.n_parts))
    parts_in = np.flatnonzero(pos >= 0)
    F[pos[parts_in], parts_in] = mask[parts_in]
    return F


def _block(group: list, v: str | None, groups: tuple, parts: Parts):
    """(KronBlock, batch rows, the block's answer per row) of merged members."""
    first = group[0]
    masks, gs = first.masks, first.gs
    positions, per_col_keys = groups
    where, keys = dict(zip(gs, positions)), dict(zip(gs, per_col_keys))
    if v is not None:
        stacked, which = np.unique(np.stack([m.masks[v] for m in group]), axis=0,
                                   return_inverse=True)
    factors = []
    for k, p in enumerate(parts.partitions):
        if masks is None:                          # WHERE FALSE: every count is 0
            mask = np.zeros(p.n_parts) if k == 0 else np.ones(p.n_parts)
        elif p.column == v:
            factors.append(stacked.astype(float))
            continue
        else:
            mask = masks[p.column] if p.column in masks else np.ones(p.n_parts, dtype=bool)
        factors.append(_factor(p, mask, where, keys))
    block = KronBlock(tuple(factors))
    shape = tuple(F.shape[0] for F in factors)
    grid = np.indices([len(c) for c in per_col_keys]).reshape(len(gs), -1) if gs else None
    index = [grid[gs.index(p.column)] if p.column in where else np.zeros(1, dtype=np.int64)
             for p in parts.partitions]
    base = np.ravel_multi_index(index, shape)       # C order over gs as written
    rows = np.array([m.start for m in group])
    target = (rows[:, None] + np.arange(first.count)).reshape(-1)
    if v is None:
        return block, target, np.tile(base, len(group))
    stride = math.prod(shape[parts.index[v] + 1:])
    return block, target, (base[None, :] + np.asarray(which).reshape(-1, 1) * stride).reshape(-1)


def _check_clique(q: Query, gs: tuple, masks: dict | None, parts: Parts) -> None:
    """Refuse a statement whose block would read too large a marginal (before building)."""
    used = set(gs) | {c for c, t in (masks or {}).items() if not t.all()}
    cols = [p for p in parts.partitions if p.column in used]
    cells = math.prod(p.n_parts for p in cols)
    if cells > MAX_CLIQUE_CELLS:
        raise UnsupportedQueryError(
            f"statement {q.index + 1} reads {len(cols)} columns together ("
            + ", ".join(f"{p.column}={p.n_parts} parts" for p in cols)
            + f"): their marginal has {cells:,} cells, more than the limit of "
            f"{MAX_CLIQUE_CELLS:,} for one block; group by fewer columns in one statement, "
            "or coarsen a column's groups")


def _members(queries: list[Query], policy, parts: Parts, groups: dict):
    """Every statement's grouping sets as members (rows), and each statement's Output."""
    members, outputs, m = [], [], 0
    for q in cancel.checked(queries):
        try:
            masks = _filters(q, policy, parts)
        except NotFactorable:
            raise NotFactorable(q) from None
        keys, gids, start = [], [], m
        for gs in q.grouping_sets:
            if gs not in groups:
                groups[gs] = group_rows(policy, parts, gs)
            per_col_keys = groups[gs][1]
            _check_clique(q, gs, masks, parts)
            count = math.prod(len(k) for k in per_col_keys)
            if count > MAX_ANSWERS:
                raise UnsupportedQueryError(
                    f"statement {q.index + 1} groups by {', '.join(gs)}: {count:,} groups, "
                    f"more than the limit of {MAX_ANSWERS:,} answers; split it")
            members.append(_Member(q, gs, masks, m, count))
            set_keys, gid = output_keys(q, gs, per_col_keys)
            keys += set_keys
            gids += [gid] * len(set_keys)
            m += len(set_keys)
            if m > MAX_ANSWERS:
                raise UnsupportedQueryError(
                    f"this batch has more than {MAX_ANSWERS:,} answers (statement "
                    f"{q.index + 1} groups by {', '.join(gs)}); split it into smaller batches")
        outputs.append(make_output(q, start, m, keys, gids))
    return members, outputs, m


def implicit_workload(queries: list[Query], policy, parts: Parts) -> ImplicitWorkload:
    """Step 3 in blocks (raises :class:`NotFactorable` for a statement that is not).
    Statements of the same shape (same grouping set, conditions differing on one column
    only, such as one range each) share one block whose factor on that column stacks their
    conditions: a batch of 24,975 statements over nine GROUP BY columns is nine blocks."""
    groups: dict = {}
    members, outputs, m = _members(queries, policy, parts, groups)
    blocks, rows = [], []
    for group, v in cancel.checked(_merged(members)):
        block, target, source = _block(group, v, groups[group[0].gs], parts)
        rows.append(BlockRows(len(blocks), target, source))
        blocks.append(block)
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
