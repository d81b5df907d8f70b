"""The PEP 249 type objects and constructors of the DB-API driver (:mod:`dpsql.interfaces.dbapi`),
and the type code of a released column (``Cursor.description``)."""

from __future__ import annotations

import datetime
import numbers


class DBAPITypeObject:
    """A PEP 249 type object: equal to every type code (DuckDB type name) it covers."""

    def __init__(self, name: str, *type_codes: str):
        self.name = name
        self.type_codes = frozenset(type_codes)

    def __eq__(self, other) -> bool:
        if isinstance(other, DBAPITypeObject):
            return self is other
        return isinstance(other, str) and other.upper() in self.type_codes

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DB-API type {self.name}>"


STRING = DBAPITypeObject("STRING", "VARCHAR")
BINARY = DBAPITypeObject("BINARY", "BLOB")
NUMBER = DBAPITypeObject("NUMBER", "BIGINT", "INTEGER", "DOUBLE", "DECIMAL")
DATETIME = DBAPITypeObject("DATETIME", "DATE", "TIME", "TIMESTAMP")
ROWID = DBAPITypeObject("ROWID", "ROWID")

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = bytes
DateFromTicks = datetime.date.fromtimestamp              # local time, as the PEP's examples
TimestampFromTicks = datetime.datetime.fromtimestamp


def TimeFromTicks(ticks: float) -> datetime.time:
    return TimestampFromTicks(ticks).time()


def _type_code(values) -> str | None:
    """The DuckDB type name of a released column, from its (public) values."""
    for v in values:
        if v is None:
            continue
        if isinstance(v, str):
            return "VARCHAR"
        return "BIGINT" if isinstance(v, numbers.Integral) else "DOUBLE"
    return None


#: the last columns of every result table: count, stderr, ci_low, ci_high (DOUBLE, and
#: NULL in every row for stderr and the interval when the error is data-dependent: MWEM)
_ANSWER_COLUMNS = 4
