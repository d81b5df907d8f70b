"""Where a protected table's rows live: the ``source`` of its policy.

    [tables.adult]
    source = { engine = "spark", table = "db.adult" }           # a Spark catalog table
    source = { engine = "spark", path = "/lake/adult", format = "parquet" }   # files
    source = { engine = "duckdb" }                                # the default

By default (no ``source``) the rows are the DuckDB table of the policy's name in the control
database. A Spark source is read by the Spark engine (``dpsql[spark]``): a catalog table
(``table``: ``name``, ``db.name`` or ``catalog.db.name``) or files at ``path`` in
``format`` ``parquet`` (default), ``csv`` (a header row; every column read as text, so the
one number grammar reads the numbers, never Spark's own CSV inference, which would look at
the values) or ``delta`` (needs the Delta Lake connector on the Spark session). Whatever the
source, analysts name the table by the policy's name, and the ledger, caches, measurements
and result tables stay in the DuckDB control database. The source is public: where the
table lives, never what it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from dpsql.errors import PolicyError

ENGINES = ("duckdb", "spark")
FORMATS = ("parquet", "csv", "delta")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}")


@dataclass(frozen=True)
class Source:
    """A protected table's source (module docstring); validated on construction."""

    engine: str = "duckdb"
    table: str | None = None
    path: str | None = None
    format: str | None = None

    def __post_init__(self):
        where = "source"
        if self.engine not in ENGINES:
            raise PolicyError(f"{where}: engine must be one of {list(ENGINES)}, got "
                              f"{self.engine!r}")
        if self.engine == "duckdb":
            if (self.table, self.path, self.format) != (None, None, None):
                raise PolicyError(f"{where}: a DuckDB source is the table of the policy's name "
                                  "in the database; drop table, path and format (or write "
                                  'engine = "spark")')
            return
        if (self.table is None) == (self.path is None):
            raise PolicyError(f"{where}: a Spark source names either a catalog table "
                              '(table = "db.adult") or files (path = "…", format = "parquet"), '
                              "exactly one of them")
        if self.table is not None and not (isinstance(self.table, str)
                                           and _NAME.fullmatch(self.table)):
            raise PolicyError(f"{where}: table must be a Spark table name such as db.adult "
                              f"(letters, digits, _; at most catalog.db.name), got "
                              f"{self.table!r}")
        if self.path is not None and not (isinstance(self.path, str) and self.path.strip()):
            raise PolicyError(f"{where}: path must be a non-empty string, got {self.path!r}")
        if self.table is not None and self.format is not None:
            raise PolicyError(f"{where}: format goes with path (a catalog table knows its "
                              "own format); drop format")
        if self.path is not None and self.format not in (None,) + FORMATS:
            raise PolicyError(f"{where}: format must be one of {list(FORMATS)}, got "
                              f"{self.format!r}")

    @property
    def spark(self) -> bool:
        return self.engine == "spark"

    @property
    def file_format(self) -> str:
        return self.format or "parquet"

    def describe(self) -> dict:
        out: dict = {"engine": self.engine}
        for key in ("table", "path", "format"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def label(self) -> str:
        """How messages name it: ``Spark table db.adult``, ``parquet files at /lake``."""
        if not self.spark:
            return "DuckDB table"
        if self.table is not None:
            return f"Spark table {self.table}"
        return f"{self.file_format} files at {self.path}"


def source_from_spec(table: str, spec: Any) -> Source:
    """The ``source`` entry of ``table``'s policy (a TOML inline table or a dict)."""
    if spec is None:
        return Source()
    if not isinstance(spec, Mapping):
        raise PolicyError(f"policy for table {table!r}: source must be a table such as "
                          '{ engine = "spark", table = "db.adult" }, got '
                          f"{type(spec).__name__}")
    unknown = set(spec) - {"engine", "table", "path", "format"}
    if unknown:
        raise PolicyError(f"policy for table {table!r}: unknown source field(s) "
                          f"{sorted(unknown)} (allowed: engine, table, path, format)")
    try:
        return Source(engine=spec.get("engine", "duckdb"), table=spec.get("table"),
                      path=spec.get("path"), format=spec.get("format"))
    except PolicyError as exc:
        raise PolicyError(f"policy for table {table!r}: {exc}") from None
