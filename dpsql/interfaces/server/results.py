"""Outcomes of statements as the wire sends them: columns with type OIDs, rows as text."""

from __future__ import annotations

import datetime
import decimal
import math
from dataclasses import dataclass, field

from dpsql.errors import error_row, one_line

#: DuckDB type name -> PostgreSQL type OID (text format; anything else is sent as text)
OIDS = {"BOOLEAN": 16, "BIGINT": 20, "HUGEINT": 1700, "INTEGER": 23, "SMALLINT": 21,
        "TINYINT": 21, "UBIGINT": 1700, "UINTEGER": 20, "USMALLINT": 23, "UTINYINT": 21,
        "DOUBLE": 701, "FLOAT": 700, "REAL": 700, "VARCHAR": 25, "DATE": 1082,
        "TIMESTAMP": 1114, "TIMESTAMP WITH TIME ZONE": 1184, "TIME": 1083, "BLOB": 17,
        "UUID": 2950, "INTERVAL": 1186}
TEXT = 25


def oid(type_name) -> int:
    name = str(type_name or "VARCHAR").upper()
    if name.startswith("DECIMAL"):
        return 1700
    if name.endswith("[]"):
        return 1009 if OIDS.get(name[:-2], TEXT) == TEXT else 1016 if "INT" in name else 1009
    return OIDS.get(name, TEXT)


def text(value) -> str | None:
    """A value as PostgreSQL's text format writes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "{" + ",".join("NULL" if v is None else _array_item(text(v))
                              for v in value) + "}"
    if isinstance(value, (datetime.date, datetime.time, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, dict):
        return str(value)
    return str(value)


def _array_item(item: str) -> str:
    if item == "" or any(c in item for c in ',{}" \\') or item.upper() == "NULL":
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return item


@dataclass
class Result:
    """One statement's outcome: rows (``columns`` not None) and the command tag."""

    tag: str
    columns: list | None = None            # (name, type oid)
    rows: list = field(default_factory=list)

    @classmethod
    def table(cls, names, types, rows, tag: str = "SELECT") -> "Result":
        return cls(f"{tag} {len(rows)}" if tag == "SELECT" else tag,
                   [(n, oid(t)) for n, t in zip(names, types)],
                   [[text(v) for v in r] for r in rows])


@dataclass
class Failure:
    """One statement refused: its SQLSTATE (from the one error table) and one line."""

    sqlstate: str
    message: str

    @classmethod
    def of(cls, error: BaseException) -> "Failure":
        return cls(error_row(error).sqlstate, one_line(error))


@dataclass
class Notice:
    """A notice the DB-API connection gave (a no-op BEGIN/COMMIT/ROLLBACK, a discarded or
    empty workload block): sent as a NoticeResponse, before its statement's outcome."""

    message: str
