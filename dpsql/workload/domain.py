"""Declared public domains of columns, and the *units* they are made of.

A column's declared domain is cut into **units**, the finest pieces dpsql ever
distinguishes for that column. Units come from the policy alone, never from the data:

- ``categorical``: one unit per declared value, then an implicit ``other`` unit (every
  non-NULL value that is not declared), then ``NULL`` when the column is nullable.
- ``integer`` (``min``, ``max``, ``step``): unit ``k`` holds the integers
  ``[min + k*step, min + (k+1)*step - 1]`` (the last one ends at ``max``).
- ``numeric`` (``min``, ``max``, ``edges``): one unit per bin ``[e_i, e_{i+1})``; the last bin
  is closed ``[e_{k-1}, max]``.

Out-of-domain rows (the documented rule, applied by the engine when it counts):

- integer / numeric values are clamped to ``[min, max]`` (integers are floored to the
  ``step`` grid); a predicate sees the clamped value. NaN counts as ``max`` (it sorts above
  every number), ``±inf`` as ``max`` / ``min``; a value that cannot be read as a number
  counts as NULL;
- integer categories match only values that are whole numbers (2.7 is ``other``, not 3);
- categorical values not declared fall in ``other``: ``=`` / ``IN`` on declared values never
  select it, ``<>`` / ``NOT IN`` do;
- ``NULL`` is its own unit when the column is ``nullable`` and follows SQL three-valued logic
  (every comparison with it is UNKNOWN). In a column *not* declared nullable a NULL is treated
  as out of domain: categorical -> ``other``, integer / numeric -> clamped to ``min``.

The kinds live in :mod:`dpsql.workload.categorical` and :mod:`dpsql.workload.ordered`, what
they share (units, Kleene truth values, :class:`NotExpressible`) in :mod:`dpsql.workload.units`;
this module builds one column's domain from its policy entry.
"""

from __future__ import annotations

from typing import Any, Union

from dpsql.errors import PolicyError
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain, NumericDomain

Domain = Union[CategoricalDomain, IntegerDomain, NumericDomain]


def domain_from_spec(table: str, column: str, spec: Any) -> Domain:
    """Build and validate one column's domain from its policy entry (a dict)."""
    if not isinstance(spec, dict):
        raise PolicyError(
            f"table {table!r}, column {column!r}: expected a table like "
            "{ type = \"integer\", min = 0, max = 10 }, got " + type(spec).__name__
        )
    kind = spec.get("type")
    nullable = spec.get("nullable", False)
    if not isinstance(nullable, bool):
        raise PolicyError(f"table {table!r}, column {column!r}: nullable must be true or false")
    allowed = {
        "categorical": {"type", "values", "nullable"},
        "integer": {"type", "min", "max", "step", "nullable"},
        "numeric": {"type", "min", "max", "edges", "nullable"},
    }
    if not isinstance(kind, str) or kind not in allowed:
        raise PolicyError(
            f"table {table!r}, column {column!r}: type must be one of categorical, integer, "
            f"numeric; got {kind!r}"
        )
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise PolicyError(
            f"table {table!r}, column {column!r}: unknown field(s) {sorted(unknown)} for a "
            f"{kind} domain (allowed: {sorted(allowed[kind])})"
        )
    try:
        if kind == "categorical":
            values = spec.get("values")
            if not isinstance(values, (list, tuple)):
                raise PolicyError(
                    f"table {table!r}, column {column!r}: categorical domain needs a list "
                    "`values`"
                )
            dom: Domain = CategoricalDomain(tuple(values), nullable)
        elif kind == "integer":
            for need in ("min", "max"):
                if need not in spec:
                    raise PolicyError(
                        f"table {table!r}, column {column!r}: integer domain needs `{need}`"
                    )
            dom = IntegerDomain(spec["min"], spec["max"], spec.get("step", 1), nullable)
        else:
            for need in ("min", "max", "edges"):
                if need not in spec:
                    raise PolicyError(
                        f"table {table!r}, column {column!r}: numeric domain needs `{need}`"
                    )
            edges = spec["edges"]
            if not isinstance(edges, (list, tuple)):
                raise PolicyError(
                    f"table {table!r}, column {column!r}: `edges` must be a list of numbers"
                )
            dom = NumericDomain(spec["min"], spec["max"], tuple(edges), nullable)
    except TypeError as exc:  # e.g. comparing str with int inside validation
        raise PolicyError(f"table {table!r}, column {column!r}: malformed domain ({exc})") from None
    dom.validate(table, column)
    return dom
