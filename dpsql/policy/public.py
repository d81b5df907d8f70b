"""Public lookup tables declared in a protected table's policy (joins, issue 20 item 4).

A data owner may declare small public tables beside a protected one, with their rows inline::

    [tables.adult.public.education_levels]
    key = "education"
    columns = ["education", "level", "years"]
    rows = [["Preschool", "primary", 1], ["Bachelors", "tertiary", 16], ...]

Their rows are public: they are part of the policy (stored with it when the table is
protected, so they are versioned with it: a changed row is a changed policy). A query may
``JOIN`` one on its key (:mod:`dpsql.sql.joins`); the join is many-to-one, so a protected row
matches at most one public row and nothing counts twice. Checked here, when the policy is
loaded (so at ``protect``, before anything is stored):

- the key names a column of the public table *and* a categorical column of the protected
  table; every key is one of that column's declared values (an undeclared one would fall in
  the column's ``other`` unit, which no condition can split), of its type, and no key repeats;
- column names are plain identifiers, distinct; every row has one value per column;
- each non-key column holds strings only or numbers only (finite; no booleans, no NULL:
  TOML has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dpsql.errors import PolicyError
from dpsql.workload.categorical import CategoricalDomain

_FIELDS = {"key", "columns", "rows"}


@dataclass(frozen=True)
class PublicTable:
    """One declared public table: its key, columns and rows (validated)."""

    name: str
    key: str                 # a column of this table and a categorical column of the protected
    columns: tuple           # column names, lower case
    rows: tuple              # tuples, one value per column

    def column_index(self, name: str) -> int:
        return self.columns.index(name.lower())

    def sql_type(self, column: str) -> str:
        """The DuckDB type of a column's values (the result column of a GROUP BY on it)."""
        values = [r[self.column_index(column)] for r in self.rows]
        if all(isinstance(v, str) for v in values):
            return "VARCHAR"
        return "BIGINT" if all(isinstance(v, int) for v in values) else "DOUBLE"

    def row_of(self) -> dict:
        """key value -> its row."""
        k = self.column_index(self.key)
        return {r[k]: r for r in self.rows}

    def describe(self) -> dict:
        return {"key": self.key, "columns": list(self.columns),
                "rows": [list(r) for r in self.rows]}


def public_tables(table: str, spec: Any, domains: Mapping[str, Any]) -> tuple:
    """The ``public`` section of a table's policy: a tuple of :class:`PublicTable`, sorted
    by name. ``domains``: the protected table's declared columns."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise PolicyError(f"policy for table {table!r}: `public` must hold one "
                          f"[tables.{table}.public.<name>] section per public table")
    out = [_public_table(table, name, entry, domains) for name, entry in spec.items()]
    return tuple(sorted(out, key=lambda p: p.name))


def _public_table(table: str, name: Any, entry: Any, domains: Mapping[str, Any]) -> PublicTable:
    where = f"public table {name!r} of {table!r}"
    if not (isinstance(name, str) and name.isidentifier() and name.isascii()):
        raise PolicyError(f"{where}: the name must be a plain SQL identifier")
    if name.lower() == table.lower():
        raise PolicyError(f"{where}: a public table cannot have the protected table's name")
    if not isinstance(entry, Mapping) or set(entry) != _FIELDS:
        got = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
        raise PolicyError(f"{where}: declare exactly `key`, `columns` and `rows` (got {got})")
    columns = _columns(where, entry["columns"])
    key = entry["key"]
    if not isinstance(key, str) or key.lower() not in columns:
        raise PolicyError(f"{where}: `key` must name one of its columns {list(columns)}")
    key = key.lower()
    domain = domains.get(key)
    if not isinstance(domain, CategoricalDomain):
        raise PolicyError(f"{where}: its key {key!r} must be a categorical column declared in "
                          f"{table!r}'s policy (the join matches the column's declared values)")
    rows = _rows(where, entry["rows"], columns)
    _check_keys(where, rows, columns.index(key), domain)
    for i, c in enumerate(columns):
        if c != key:
            _check_kind(where, c, [r[i] for r in rows])
    return PublicTable(name.lower(), key, columns, rows)


def _columns(where: str, columns: Any) -> tuple:
    if not isinstance(columns, list) or not columns:
        raise PolicyError(f"{where}: `columns` must be a list of column names")
    out = []
    for c in columns:
        if not (isinstance(c, str) and c.isidentifier() and c.isascii()):
            raise PolicyError(f"{where}: column name {c!r} must be a plain SQL identifier")
        if c.lower() in out:
            raise PolicyError(f"{where}: column {c!r} is listed twice")
        out.append(c.lower())
    return tuple(out)


def _rows(where: str, rows: Any, columns: tuple) -> tuple:
    if not isinstance(rows, list) or not rows:
        raise PolicyError(f"{where}: `rows` must be a non-empty list of rows")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, list) or len(r) != len(columns):
            raise PolicyError(f"{where}: row {i + 1} must list {len(columns)} values "
                              f"({', '.join(columns)})")
        out.append(tuple(r))
    return tuple(out)


def _check_keys(where: str, rows: tuple, k: int, domain: CategoricalDomain) -> None:
    declared = set(domain.values)
    seen: set = set()
    for i, r in enumerate(rows):
        v = r[k]
        if isinstance(v, bool) or type(v) is not type(domain.values[0]) or v not in declared:
            raise PolicyError(f"{where}: row {i + 1}'s key {v!r} is not a declared value of "
                              "the key column; declare it there, or drop the row")
        if v in seen:
            raise PolicyError(f"{where}: key {v!r} appears twice; a public table's key must "
                              "be unique (the join is many-to-one)")
        seen.add(v)


def _check_kind(where: str, column: str, values: list) -> None:
    strings = all(isinstance(v, str) for v in values)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                  and math.isfinite(v) for v in values)
    if not (strings or numbers):
        raise PolicyError(f"{where}: column {column!r} must hold strings only or finite "
                          "numbers only")
