"""Step 1 of the compile for statements of one *shape* at a time, vectorised (public only).

A batch of thousands of statements is usually a few shapes — the WHERE tree with its
constants and positions left out (``x = ?``, ``x >= ? AND x <= ?``) — repeated with
different constants. :func:`conditions` evaluates each shape's atoms for all its statements
at once (a domain's ``compare_many``: one row per constant, the same comparisons as its
``compare``) and its one-column sub-conditions by the same Kleene operations, on matrices
with a row per statement, so the truth per unit of every ``(sub-condition, negated)`` is what
:func:`dpsql.sql.compile._conditions` computes statement by statement, element for element.
A batch where any condition fails to compile gets None: the per-statement pass then raises
the first statement's error, as before.
"""

from __future__ import annotations

import numpy as np

from dpsql import cancel
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.conditions import _atom_truth, _combine
from dpsql.sql.ir import Atom, BoolOp, Const
from dpsql.workload.units import FALSE, TRUE, NotExpressible

#: statements evaluated together: at most about this many truth values per matrix
CHUNK_VALUES = 1 << 22


def shape(pred) -> tuple | None:
    """The condition without its constants and positions (None: no WHERE)."""
    kind = type(pred)                 # the IR's exact classes (asked once per statement)
    if kind is Atom:
        return ("atom", pred.column, pred.op)
    if kind is BoolOp:
        return (pred.op, tuple([shape(c) for c in pred.children]))
    if kind is Const:
        return ("const", pred.value)
    return None


def shape_columns(sh) -> frozenset:
    """The columns a shape reads (:func:`dpsql.sql.conditions._columns` of its conditions)."""
    if sh[0] == "atom":
        return frozenset((sh[1],))
    if sh[0] == "const":
        return frozenset()
    return frozenset().union(*(shape_columns(c) for c in sh[1]))


def shape_parts(sh, path: tuple = (), negated: bool = False):
    """``(column, path, negated)`` of the shape's maximal one-column sub-conditions, as
    :func:`dpsql.sql.conditions._single_column_parts` finds them (``path``: child indices)."""
    if sh is None or sh[0] == "const":
        return
    cols = shape_columns(sh)
    if len(cols) == 1:
        yield next(iter(cols)), path, negated
        return
    for i, child in enumerate(sh[1]):
        yield from shape_parts(child, path + (i,), negated or sh[0] == "not")


def at(pred, path: tuple):
    """The sub-condition of ``pred`` at ``path``."""
    for i in path:
        pred = pred.children[i]
    return pred


def groups(queries: list, of: dict | None = None) -> dict:
    """Statements by the shape of their WHERE, in batch order within each shape; ``of``
    (when given) gets ``id(statement) -> (statement, shape)``."""
    out: dict = {}
    for q in queries:
        sh = shape(q.where)
        out.setdefault(sh, []).append(q)
        if of is not None:
            of[id(q)] = (q, sh)
    return out


def conditions(shapes: dict, policy) -> dict | None:
    """``{(sub-condition, negated): truth per unit}`` of the one-column sub-conditions of
    every statement of ``shapes`` (:func:`groups`; TRUE vs not-TRUE unless under a NOT), or
    None when a condition cannot be compiled (the caller's per-statement pass then raises
    its error)."""
    unit_truth: dict = {}
    try:
        for sh, members in shapes.items():
            parts = list(shape_parts(sh))
            if not parts:
                continue
            n_units = max(policy.column(c).n_units for c, _, _ in parts)
            step = max(1, CHUNK_VALUES // max(n_units, 1))
            for first in range(0, len(members), step):
                cancel.check()
                _chunk(members[first:first + step], sh, parts, policy, unit_truth)
    except (UnsupportedQueryError, NotExpressible):
        return None
    return unit_truth


def first_column(pred) -> str | None:
    """The column of ``pred``'s first atom (depth first), None without one."""
    kind = type(pred)
    if kind is Atom:
        return pred.column
    if kind is BoolOp:
        for child in pred.children:
            found = first_column(child)
            if found is not None:
                return found
    return None


def _chunk(members: list, sh, parts: list, policy, unit_truth: dict) -> None:
    mats = [_atom_rows(_at_all(members, path), policy) for path in _atom_paths(sh)]
    for column, path, negated in parts:
        n_units = policy.column(column).n_units
        truth = np.broadcast_to(_kleene(_node(sh, path), mats, _first_atom(sh, path))[0],
                                (len(members), n_units))
        if not negated:            # TRUE vs not-TRUE: np.where(truth == TRUE, TRUE, FALSE)
            truth = (truth == TRUE).view(np.int8)          # in int8 (FALSE is 0), in place
            truth *= np.int8(TRUE)
        for sub, row in zip(_at_all(members, path), truth):
            unit_truth.setdefault((sub, negated), row)


def _atom_paths(sh, path: tuple = ()):
    """The paths of the shape's atoms, depth first (the order of
    :func:`dpsql.sql.conditions._atoms`)."""
    if sh[0] == "atom":
        yield path
    elif sh[0] != "const":
        for i, child in enumerate(sh[1]):
            yield from _atom_paths(child, path + (i,))


def _at_all(members: list, path: tuple) -> list:
    """:func:`at` of every statement's WHERE (the common short paths without a call each)."""
    if not path:
        return [q.where for q in members]
    if len(path) == 1:
        i = path[0]
        return [q.where.children[i] for q in members]
    return [at(q.where, path) for q in members]


def _atom_rows(atoms: list, policy) -> np.ndarray:
    """The truth per unit of atoms of one column and operator, a row each."""
    domain = policy.column(atoms[0].column)
    op = atoms[0].op
    if op not in ("isnull", "units"):
        found = domain.compare_many(op, [a.value for a in atoms])
        if found is not None:
            found.flags.writeable = False
            return found
    rows = np.stack([_atom_truth(a, domain) for a in atoms])
    rows.flags.writeable = False
    return rows


def _node(sh, path: tuple):
    for i in path:
        sh = sh[1][i]
    return sh


def _first_atom(sh, path: tuple) -> int:
    """How many atoms come before the sub-shape at ``path`` (depth first, as :func:`_atoms`)."""
    count = 0
    for i in path:
        count += sum(_n_atoms(c) for c in sh[1][:i])
        sh = sh[1][i]
    return count


def _n_atoms(sh) -> int:
    if sh[0] == "atom":
        return 1
    if sh[0] == "const":
        return 0
    return sum(_n_atoms(c) for c in sh[1])


def _kleene(sh, mats: list, i: int) -> tuple:
    """(truth, next atom index): :func:`dpsql.sql.conditions._kleene` on rows of atoms."""
    if sh[0] == "atom":
        return mats[i], i + 1
    if sh[0] == "const":
        return np.int8(TRUE if sh[1] else FALSE), i
    if sh[0] == "not":
        value, i = _kleene(sh[1][0], mats, i)
        return (TRUE - value).astype(np.int8), i
    values = []
    for child in sh[1]:
        value, i = _kleene(child, mats, i)
        values.append(value)
    return _combine(sh[0], values), i
