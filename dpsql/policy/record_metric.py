"""Metric (d_X) privacy for counting workloads: the declared record metric and its budget.

Model (Chatzikokolakis et al. 2013; Kamalaruban et al., "d_X-private mechanisms for linear
queries"). A release is d_X-private with ``ε`` per unit distance when, for every data set and
every change of ONE record from value ``u`` to value ``v``, the output densities stay within a
factor ``exp(ε · d(u, v))``. ``d`` is the record metric declared by the data owner; changes of
the number of records are not covered (the table's size is public under this model).

Declared in a table's policy::

    [tables.adult.metric]
    epsilon = 1.0          # budget: cumulative ε per unit distance, separate from (ε, δ)
    [tables.adult.metric.columns]
    age = { weight = 0.1 }                       # integer column: |Δage| × 0.1
    hours = { weight = 0.1, null = 5.0 }         # nullable: NULL is 5.0 from every value
    sex = { different = 1.0 }                    # any column: 1.0 between distinct values
    race = { matrix = [[0,1,2],[1,0,1],[2,1,0]], other = 2.0 }

Per column, exactly one of

- ``weight = w`` (integer columns): ``w · |u − v|``. ``null = c`` is required when the column is
  nullable (NULL is ``c`` from every value). Not allowed on numeric columns: their bins touch
  (39.999 vs 40), so the distance between neighbouring bins is 0 and no finite noise could
  separate them; use ``different`` or declare the column integer.
- ``different = w`` (any column): ``w`` between any two distinct values, ``other`` and NULL
  included (the discrete metric).
- ``matrix = [[...]]`` (categorical columns): distances between the declared ``values``, in
  declaration order; symmetric, zero diagonal, positive off the diagonal, triangle
  inequality. ``other = c`` is required: the distance from the implicit ``other`` unit and
  from NULL to every declared value and to each other.

The record distance is the sum over columns (an L1 product metric). A column without an entry
has distance 0: a release under the metric may never depend on it, and a batch that uses it
is refused. Distances are read exactly (floats through their shortest repr). The metric is on
records as dpsql reads them: after the documented clamping to ``[min, max]`` (1-Lipschitz, so
the guarantee carries over to raw values) and flooring to the declared integer grid.

What the declaration means for compiled cells (the cell graph a release is checked on) is
:mod:`dpsql.policy.metric`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Mapping

import numpy as np

from dpsql.noise.accounting import fraction_from_text
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain, NumericDomain
from dpsql.errors import PolicyError, PrivacyParameterError

#: the largest categorical distance matrix (the triangle check is cubic)
MAX_MATRIX_CATEGORIES = 256

_COLUMN_KINDS = ("weight", "different", "matrix")
_COLUMN_FIELDS = {"weight": {"weight", "null"}, "different": {"different"},
                  "matrix": {"matrix", "other"}}


def _exact(value: Any, where: str) -> Fraction:
    """A declared distance or budget as an exact Fraction (also ``"num/den"`` text)."""
    if isinstance(value, str):
        try:
            return fraction_from_text(value)
        except PrivacyParameterError:
            raise PolicyError(f"{where} must be a number, got the text {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal)):
        raise PolicyError(f"{where} must be a number, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyError(f"{where} must be finite, got {value!r}")
        return Fraction(repr(float(value)))
    if isinstance(value, Decimal) and not value.is_finite():
        raise PolicyError(f"{where} must be finite, got {value}")
    return Fraction(value)


def _positive(value: Any, where: str) -> Fraction:
    f = _exact(value, where)
    if f <= 0:
        raise PolicyError(f"{where} must be > 0, got {float(f)!r}")
    return f


def _text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


@dataclass(frozen=True)
class ColumnMetric:
    """One column's declared distance (see the module docstring for the schema)."""

    column: str
    kind: str                       # "weight" | "different" | "matrix"
    value: Fraction | None = None   # the weight, or the `different` distance
    matrix: tuple | None = None     # tuple of tuples of Fraction (declared values)
    other: Fraction | None = None   # matrix: distance from `other` / NULL to everything
    null: Fraction | None = None    # weight: distance from NULL to every value
    table: str = "?"

    def __post_init__(self) -> None:
        where = f"table {self.table!r}, metric of column {self.column!r}"
        if self.kind not in _COLUMN_KINDS:
            raise PolicyError(f"{where}: kind must be one of {_COLUMN_KINDS}, got {self.kind!r}")
        fix = lambda name, v: object.__setattr__(self, name, v)  # noqa: E731
        if self.kind in ("weight", "different"):
            fix("value", _positive(self.value, f"{where}: {self.kind}"))
        if self.null is not None:
            if self.kind != "weight":
                raise PolicyError(f"{where}: `null` goes with `weight` only")
            fix("null", _positive(self.null, f"{where}: null"))
        if self.kind == "matrix":
            fix("other", _positive(self.other, f"{where}: other"))
            if not isinstance(self.matrix, (list, tuple)) or not all(
                    isinstance(r, (list, tuple)) for r in self.matrix):
                raise PolicyError(f"{where}: matrix must be a list of rows of numbers")
            fix("matrix", tuple(tuple(_exact(v, f"{where}: matrix entry ({a}, {b})")
                                      for b, v in enumerate(row))
                                for a, row in enumerate(self.matrix)))
            _check_matrix(self.matrix, where, self.other)
        elif self.matrix is not None or self.other is not None:
            raise PolicyError(f"{where}: `matrix` / `other` go with kind 'matrix' only")

    def describe(self) -> dict:
        if self.kind == "matrix":
            return {"matrix": [[_text(v) for v in row] for row in self.matrix],
                    "other": _text(self.other)}
        out = {self.kind: _text(self.value)}
        if self.null is not None:
            out["null"] = _text(self.null)
        return out


def _check_matrix(matrix, where: str, other: Fraction) -> None:
    """Square, symmetric, zero diagonal, positive off-diagonal, triangle inequality (with the
    `other` point appended). Exact: entries are scaled to integers by their common
    denominator."""
    k = len(matrix)
    if k < 1 or k > MAX_MATRIX_CATEGORIES:
        raise PolicyError(f"{where}: matrix must have 1 to {MAX_MATRIX_CATEGORIES} rows, got {k}")
    for a, row in enumerate(matrix):
        if len(row) != k:
            raise PolicyError(f"{where}: matrix must be square ({k}×{k}); row {a} has "
                              f"{len(row)} entries")
    for a in range(k):
        if matrix[a][a] != 0:
            raise PolicyError(f"{where}: matrix diagonal must be 0; entry ({a}, {a}) is "
                              f"{float(matrix[a][a])!r}")
        for b in range(a + 1, k):
            if matrix[a][b] != matrix[b][a]:
                raise PolicyError(f"{where}: matrix must be symmetric; entry ({a}, {b}) is "
                                  f"{float(matrix[a][b])!r} but ({b}, {a}) is "
                                  f"{float(matrix[b][a])!r}")
            if matrix[a][b] <= 0:
                raise PolicyError(f"{where}: off-diagonal distances must be > 0; entry "
                                  f"({a}, {b}) is {float(matrix[a][b])!r}")
    ext = [list(row) + [other] for row in matrix] + [[other] * k + [Fraction(0)]]
    den = math.lcm(*(v.denominator for row in ext for v in row))
    if den * max(v for row in ext for v in row) > 2 ** 60:
        raise PolicyError(f"{where}: matrix entries need too many digits for the exact "
                          "triangle check; round them to fewer decimals")
    M = np.array([[int(v * den) for v in row] for row in ext], dtype=np.int64)
    for b in range(k + 1):
        bad = M[:, b][:, None] + M[b, :][None, :] < M
        if bad.any():
            a, c = (int(x) for x in np.argwhere(bad)[0])
            name = ["<other>" if i == k else str(i) for i in range(k + 1)]
            raise PolicyError(
                f"{where}: matrix breaks the triangle inequality on the triple "
                f"(a, b, c) = ({name[a]}, {name[b]}, {name[c]}): d(a, c) = "
                f"{float(ext[a][c])!r} > d(a, b) + d(b, c) = {float(ext[a][b])!r} + "
                f"{float(ext[b][c])!r} (indices are positions in the declared values)")


def _column_metric_from_spec(table: str, column: str, spec: Any) -> ColumnMetric:
    where = f"table {table!r}, metric of column {column!r}"
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{where}: expected a table like {{ weight = 0.1 }}, got "
                          f"{type(spec).__name__}")
    kinds = [k for k in _COLUMN_KINDS if k in spec]
    if len(kinds) != 1:
        raise PolicyError(f"{where}: declare exactly one of weight, different, matrix; got "
                          f"{sorted(spec)}")
    kind = kinds[0]
    unknown = set(spec) - _COLUMN_FIELDS[kind]
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {sorted(unknown)} with {kind} "
                          f"(allowed: {sorted(_COLUMN_FIELDS[kind])})")
    if kind == "matrix":
        rows = spec["matrix"]
        if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple))
                                                         for r in rows):
            raise PolicyError(f"{where}: matrix must be a list of rows of numbers")
        if "other" not in spec:
            raise PolicyError(f"{where}: a matrix needs `other = <distance>`, the distance "
                              "from values outside the declared list (and NULL) to every "
                              "declared value")
        return ColumnMetric(column, kind, matrix=tuple(tuple(r) for r in rows),
                            other=_exact(spec["other"], f"{where}: other"), table=table)
    null = _exact(spec["null"], f"{where}: null") if "null" in spec else None
    return ColumnMetric(column, kind, value=_exact(spec[kind], f"{where}: {kind}"),
                        null=null, table=table)


def column_domain(domains, column: str):
    """The declared domain of ``column`` in a ``TablePolicy`` or ``{column: Domain}`` (None if
    undeclared)."""
    if hasattr(domains, "column"):
        try:
            return domains.column(column)
        except KeyError:
            return None
    return dict(domains).get(column)


@dataclass(frozen=True)
class MetricModel:
    """A table's declared d_X model: the ε-per-unit budget and per-column distances."""

    table: str
    epsilon_per_unit: Fraction      # cumulative budget of ε per unit distance
    columns: tuple                  # ((name, ColumnMetric), ...) in declaration order

    def __post_init__(self) -> None:
        eps = _positive(self.epsilon_per_unit, f"table {self.table!r}: metric epsilon")
        object.__setattr__(self, "epsilon_per_unit", eps)
        if not self.columns:
            raise PolicyError(f"table {self.table!r}: the metric must declare at least one "
                              "column distance")
        names = [c for c, _ in self.columns]
        if len(set(names)) != len(names):
            raise PolicyError(f"table {self.table!r}: a column's metric is declared twice")
        for name, cm in self.columns:
            if not isinstance(cm, ColumnMetric) or cm.column != name:
                raise PolicyError(f"table {self.table!r}: bad metric entry for {name!r}")

    def column(self, name: str) -> ColumnMetric | None:
        for c, cm in self.columns:
            if c == name.lower():
                return cm
        return None

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], *, table: str = "table",
                  domains=None) -> "MetricModel":
        """Parse a ``[tables.<t>.metric]`` section (fields ``epsilon``, ``columns``).

        ``domains`` (a ``TablePolicy`` or ``{column: Domain}``), when given, is checked with
        :meth:`validate_against`.
        """
        if not isinstance(spec, Mapping):
            raise PolicyError(f"table {table!r}: the metric section must be a table/dict")
        unknown = set(spec) - {"epsilon", "columns"}
        if unknown:
            raise PolicyError(f"table {table!r}: unknown metric field(s) {sorted(unknown)} "
                              "(allowed: ['columns', 'epsilon'])")
        for need in ("epsilon", "columns"):
            if need not in spec:
                raise PolicyError(f"table {table!r}: the metric section must declare `{need}`")
        cols = spec["columns"]
        if not isinstance(cols, Mapping):
            raise PolicyError(f"table {table!r}: metric `columns` must be a table/dict")
        model = cls(table.lower(),
                    _positive(spec["epsilon"], f"table {table!r}: metric epsilon"),
                    tuple((str(c).lower(), _column_metric_from_spec(table, str(c).lower(), s))
                          for c, s in cols.items()))
        if domains is not None:
            model.validate_against(domains)
        return model

    def validate_against(self, domains) -> None:
        """Check every entry against the table's declared column domains."""
        for name, cm in self.columns:
            where = f"table {self.table!r}, metric of column {name!r}"
            dom = column_domain(domains, name)
            if dom is None:
                raise PolicyError(f"table {self.table!r}: the metric names column {name!r}, "
                                  "which the policy does not declare")
            if cm.kind == "weight":
                if isinstance(dom, NumericDomain):
                    raise PolicyError(
                        f"{where}: `weight` cannot be used on a numeric column: its bins touch "
                        "(e.g. 39.999 and 40), so neighbouring bins are at distance 0 and no "
                        "finite noise separates them; use `different`, or declare the column "
                        "as integer")
                if not isinstance(dom, IntegerDomain):
                    raise PolicyError(f"{where}: `weight` needs an integer column; use "
                                      "`different` or `matrix` on a categorical column")
                if dom.nullable and cm.null is None:
                    raise PolicyError(f"{where}: the column is nullable; declare `null = "
                                      "<distance>` (NULL's distance to every value)")
                span = cm.value * (dom.max - dom.min)
                if cm.null is not None and 2 * cm.null < span:
                    raise PolicyError(
                        f"{where}: breaks the triangle inequality on the triple (a, b, c) = "
                        f"({dom.min}, NULL, {dom.max}): d(a, c) = {float(span)!r} > d(a, b) + "
                        f"d(b, c) = {float(cm.null)!r} + {float(cm.null)!r}; raise `null` to "
                        f"at least {float(span / 2)!r}")
            if cm.kind == "matrix":
                if not isinstance(dom, CategoricalDomain):
                    raise PolicyError(f"{where}: `matrix` needs a categorical column")
                if len(cm.matrix) != len(dom.values):
                    raise PolicyError(f"{where}: matrix is {len(cm.matrix)}×{len(cm.matrix)} "
                                      f"but the column declares {len(dom.values)} values")

    def describe(self) -> dict:
        """The model in :meth:`from_dict`'s schema, with exact ``"num/den"`` numbers."""
        return {"epsilon": _text(self.epsilon_per_unit),
                "columns": {c: cm.describe() for c, cm in self.columns}}
