"""The output of a statement answered from other rows of ``W`` (:mod:`dpsql.sql.expand`).

It stands where a COUNT statement's :class:`~dpsql.sql.compile.Output` stands
(``workload.outputs``: same ``query``, ``start``/``stop``, keys and grouping ids), so every
mechanism hands it to the result writer like any other; :meth:`Assembled.columns` builds
the result table from the released answers, standard errors and interval half-widths of the
rows it names (post-processing only):

- a count (a GROUP BY on a public table's column): its rows' answers, as a COUNT's;
- a quantile: per group, its CDF family's rows through :func:`dpsql.inference.quantiles.
  quantiles`; ``stderr`` is NULL (a quantile has an interval, not a standard error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpsql.inference.quantiles import Units, quantiles
from dpsql.sql.ir import Query


@dataclass(frozen=True)
class Assembled:
    """Where one statement's result rows come from."""

    query: Query
    start: int                   # the span of W rows the statement reads (first, one past)
    stop: int
    key_columns: tuple           # output names of the key columns
    key_sources: tuple           # source columns (a public column: "table.column")
    keys: tuple                  # per result row: tuple of key values
    grouping_ids: tuple | None
    rows: np.ndarray = field(repr=False)   # (R,) W rows; a quantile: (R, 2K-1)
    key_types: tuple = ()        # per key column: its SQL type, None for a protected column
    units: Units | None = field(default=None, repr=False)   # a quantile's column units
    q: float = math.nan
    kind: str | None = None      # "cont" / "disc" for a quantile

    assembled = True

    def columns(self, answers: np.ndarray, stderr: np.ndarray, halfwidth: np.ndarray,
                key_type) -> list:
        """(name, SQL type, values) of the result table; ``key_type(source)`` is the type of
        a protected key column."""
        cols = [(out, typ or key_type(src), [k[i] for k in self.keys])
                for i, (src, out, typ) in enumerate(zip(self.key_sources, self.key_columns,
                                                        self.key_types))]
        if self.grouping_ids is not None:
            cols.append(("grouping_id", "INTEGER", list(self.grouping_ids)))
        if self.units is None:
            a, s, h = answers[self.rows], stderr[self.rows], halfwidth[self.rows]
            value, low, high = a, a - h, a + h
        else:
            value, s, low, high = self._quantiles(answers, stderr)
        cols.append((self.query.count_name, "DOUBLE", _nulls(value)))
        cols.append(("stderr", "DOUBLE", _nulls(s)))
        cols.append(("ci_low", "DOUBLE", _nulls(low)))
        cols.append(("ci_high", "DOUBLE", _nulls(high)))
        return cols

    def _quantiles(self, answers, stderr) -> tuple:
        k = self.units.n - 1
        a, v = answers[self.rows], stderr[self.rows] ** 2
        out = quantiles(a[:, :k], a[:, k:2 * k], a[:, -1], v[:, :k], v[:, k:2 * k],
                        v[:, -1], self.q, self.kind, self.units)
        return out.value, np.full(out.value.shape, np.nan), out.ci_low, out.ci_high


def _nulls(values: np.ndarray) -> list:
    return [None if math.isnan(v) else v for v in np.asarray(values, dtype=float).tolist()]
