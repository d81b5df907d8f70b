"""Step 3 of the compile: each statement's rows of ``W`` on the dense cell product.

A statement's rows are the cells its WHERE makes TRUE (and, for ``COUNT(col)``, where
``col`` is not NULL), one row per group of each grouping set. :func:`statement_rows` does
this for the statements of one *kind* at a time — the same WHERE shape
(:func:`dpsql.sql.grouped.shape`), COUNT column, grouping sets and key columns — with a row
per statement in each array (in chunks of :data:`CHUNK_VALUES` truth values): the grouping
layout and output keys are computed once per kind, and each statement's truth per cell by the
same Kleene operations :meth:`_Cells.evaluate` applies statement by statement, element for
element. :func:`query_rows` is that per-statement definition (the tests hold the grouped
one to it). Public inputs only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from dpsql import cancel
from dpsql.sql.conditions import _broadcast, _columns, _combine
from dpsql.sql.grouped import at, shape, shape_columns
from dpsql.sql.ir import Const, Predicate, Query
from dpsql.workload.units import FALSE, TRUE

#: statements evaluated together: at most about this many cells times statements
CHUNK_VALUES = 1 << 22


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


def group_rows(policy, parts, gs: tuple) -> tuple[list, list]:
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


def _product(lists):
    if not lists:
        yield ()
        return
    yield from itertools.product(*lists)


class _Cells:
    """Truth of conditions on the dense cell product (C order over the used columns)."""

    def __init__(self, parts):
        self.parts, self.shape, self.index = parts, parts.shape, parts.index

    def broadcast(self, col: str, per_part: np.ndarray, lead: tuple = ()) -> np.ndarray:
        """``per_part`` (with ``lead`` leading axes) along ``col``'s axis of the cells."""
        shp = [1] * len(self.shape)
        shp[self.index[col]] = self.shape[self.index[col]]
        return per_part.reshape(lead + tuple(shp))

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

    def evaluate_many(self, sh, members: list, path: tuple = (),
                      negated: bool = False) -> np.ndarray:
        """:meth:`evaluate` of the sub-conditions at ``path`` of statements of WHERE shape
        ``sh`` (at that path), one leading row per statement."""
        full = (len(members),) + self.shape
        if sh is None:
            return np.full(full, TRUE, dtype=np.int8)
        if sh[0] == "const":
            return np.full(full, TRUE if sh[1] else FALSE, dtype=np.int8)
        cols = shape_columns(sh)
        if len(cols) == 1:
            c = next(iter(cols))
            truth = self.parts.unit_truth
            units = np.array([truth[(at(q.where, path), negated)] for q in members])  # rows
            # of one length and type (np.stack's result, without its per-row work)
            per_part = units if c in self.parts.unit_parts else \
                units[:, self.parts.first_units[c]]
            return np.broadcast_to(self.broadcast(c, per_part, (len(members),)), full)
        if sh[0] == "not":
            inner = self.evaluate_many(sh[1][0], members, path + (0,), True)
            return (TRUE - inner).astype(np.int8)
        out = _combine(sh[0], [self.evaluate_many(ch, members, path + (i,), negated)
                               for i, ch in enumerate(sh[1])])
        return np.broadcast_to(out, full)

    def not_null(self, column: str, policy) -> np.ndarray:
        """Cells where ``column`` is not NULL (``COUNT(column)``), on the cells' axes."""
        dom = policy.column(column)
        p = self.parts.partitions[self.index[column]]
        notnull = (TRUE - dom.is_null())[[u[0] for u in p.part_units]]
        return self.broadcast(column, notnull) == TRUE

    def selected(self, q: Query, policy) -> np.ndarray:
        """Indices of the cells a query counts (its WHERE, and COUNT(col) not NULL)."""
        mask = self.evaluate(q.where) == TRUE
        if q.count_column is not None:
            mask = mask & self.not_null(q.count_column, policy)
        return np.flatnonzero(_broadcast(mask, self.shape).reshape(-1))

    def layout(self, q: Query, policy, gs: tuple) -> tuple:
        """(group row of each cell, whether the cell is in a group, the rows' keys, the
        grouping id) of one grouping set of ``q``."""
        shape = self.shape
        positions, per_col_keys = group_rows(policy, self.parts, gs)
        group_index = np.zeros(shape, dtype=np.int64)
        valid = np.ones(shape, dtype=bool)
        for c, pos in zip(gs, positions):
            b = self.broadcast(c, pos)
            valid = valid & (b >= 0)
            group_index = group_index * len(per_col_keys[gs.index(c)]) + np.maximum(b, 0)
        set_keys, gid = output_keys(q, gs, per_col_keys)
        return (_broadcast(group_index, shape).reshape(-1), _broadcast(valid, shape).reshape(-1),
                set_keys, gid)


def query_rows(q: Query, policy, cells: _Cells, m: int):
    """(row indices, cell indices, Output) of one statement's rows of ``W`` from row ``m``."""
    selected = cells.selected(q, policy)
    rows, cols, keys, gids = [], [], [], []
    start = m
    for gs in q.grouping_sets:
        group_index, valid, set_keys, gid = cells.layout(q, policy, gs)
        gi, ok = group_index[selected], valid[selected]
        rows.append(m + gi[ok])
        cols.append(selected[ok])
        keys += set_keys
        gids += [gid] * len(set_keys)
        m += len(set_keys)
    return rows, cols, make_output(q, start, m, keys, gids)


def statement_rows(queries: list, policy, parts) -> tuple[list, list, list, int]:
    """(row index arrays, cell index arrays, Output per statement, rows of ``W``) of the
    batch: :func:`query_rows` of each statement in turn, computed kind by kind."""
    cells = _Cells(parts)
    kinds: dict = {}
    known = parts.shapes
    for i, q in enumerate(queries):
        found = known.get(id(q))
        sh = found[1] if found is not None and found[0] is q else shape(q.where)
        key = (sh, q.count_column, q.grouping_sets, q.key_columns)
        kinds.setdefault(key, []).append(i)
    layouts = {key: [cells.layout(queries[idx[0]], policy, gs) for gs in key[2]]
               for key, idx in kinds.items()}
    sizes = np.zeros(len(queries), dtype=np.int64)
    for key, idx in kinds.items():
        sizes[idx] = sum(len(lay[2]) for lay in layouts[key])
    starts = np.cumsum(sizes) - sizes
    rows, cols, outputs = [], [], [None] * len(queries)
    for key, idx in kinds.items():
        # make_output's values, which depend on the kind only (key columns, sets): once
        like = make_output(queries[idx[0]], 0, 0, [k for lay in layouts[key] for k in lay[2]],
                           [lay[3] for lay in layouts[key] for _ in lay[2]])
        shared = (like.key_columns, like.key_sources, like.keys, like.grouping_ids)
        fields = dict(zip(("key_columns", "key_sources", "keys", "grouping_ids"), shared))
        for i, start, stop in zip(idx, starts[idx].tolist(), (starts[idx] + sizes[idx]).tolist()):
            out = outputs[i] = object.__new__(Output)   # frozen, no __post_init__: its
            out.__dict__.update(query=queries[i], start=start, stop=stop)  # fields, in order
            out.__dict__.update(fields)
        step = max(1, CHUNK_VALUES // max(1, int(np.prod(cells.shape, dtype=np.int64))))
        for first in range(0, len(idx), step):
            cancel.check()
            chunk = idx[first:first + step]
            _kind_rows(cells, policy, key, [queries[i] for i in chunk], starts[chunk],
                       layouts[key], rows, cols)
    return rows, cols, outputs, int(sizes.sum())


def _kind_rows(cells: _Cells, policy, key, members, starts, layout, rows, cols) -> None:
    """Append the rows of statements of one kind (``starts``: their first rows)."""
    mask = cells.evaluate_many(key[0], members) == TRUE
    if key[1] is not None:
        mask = mask & cells.not_null(key[1], policy)
    mask = mask.reshape(len(members), -1)
    offset = 0
    for group_index, valid, set_keys, _ in layout:
        # every cell in a group, all in the first (no GROUP BY): the sums below, skipped
        which, cell = np.nonzero(mask if valid.all() else mask & valid)
        row = starts[which]
        if offset:
            row += offset
        if group_index.any():
            row += group_index[cell]
        rows.append(row)
        cols.append(cell)
        offset += len(set_keys)
