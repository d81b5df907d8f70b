"""One-column conditions of a batch, evaluated per unit in Kleene logic (public inputs only).

Helpers of :mod:`dpsql.sql.compile` (step 1): which columns a condition reads, its maximal
one-column sub-conditions, and their truth on each unit of the column's declared domain.
"""

from __future__ import annotations

import numpy as np

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.ir import Atom, Const, Predicate
from dpsql.workload.units import FALSE, TRUE, NotExpressible


def _columns(pred: Predicate) -> frozenset:
    if isinstance(pred, Const):
        return frozenset()
    if isinstance(pred, Atom):
        return frozenset((pred.column,))
    return frozenset().union(*(_columns(c) for c in pred.children))


def _broadcast(a, shape: tuple) -> np.ndarray:
    """``np.broadcast_to``, skipped when ``a`` has the shape already (most one-column
    batches: the call costs ~40 µs, thousands of times per batch)."""
    shape = tuple(shape)
    if not isinstance(a, np.ndarray) or a.shape != shape:
        return np.broadcast_to(a, shape)
    view = a.view()                     # read-only, like broadcast_to's
    view.flags.writeable = False
    return view


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
        if atom.op == "units":             # a condition on a public table's column (a join)
            return np.asarray(atom.value, dtype=np.int8)
        return domain.compare(atom.op, atom.value)
    except NotExpressible as exc:
        raise UnsupportedQueryError(
            f"condition on column {atom.column!r} cannot be answered on its declared domain: "
            f"{exc}", atom.line, atom.col) from None
