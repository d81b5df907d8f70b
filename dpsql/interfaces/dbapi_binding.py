"""Parameters bound as literals in sqlglot's syntax tree (paramstyle ``qmark``), never by
string formatting: each ``?`` becomes a literal node, and the bound text must parse back to
exactly the bound trees (:mod:`dpsql.interfaces.dbapi`)."""

from __future__ import annotations

import decimal
import math
import numbers
from typing import Any, Sequence

from sqlglot import exp

from dpsql.interfaces.dbapi_errors import DataError, InterfaceError, ProgrammingError, _backend
from dpsql.sql.marker import pieces
from dpsql.sql.parse import split_statements


def _literal(value: Any, position: int) -> exp.Expression:
    """One parameter as a syntax-tree literal; refuses every type dpsql cannot compare."""
    where = f"parameter {position}"
    if value is None:
        raise ProgrammingError(f"{where} is None: a comparison with NULL is never true in "
                               "SQL; write IS NULL / IS NOT NULL in the SQL text instead")
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, bool):
        raise ProgrammingError(f"{where} is a bool; pass an int or a str matching the "
                               "column's declared domain")
    if isinstance(value, numbers.Integral):
        number, negative = str(abs(int(value))), value < 0
    elif isinstance(value, (float, decimal.Decimal)):
        if not (math.isfinite(value) if isinstance(value, float) else value.is_finite()):
            raise ProgrammingError(f"{where} is not finite; pass a finite number")
        if isinstance(value, float):
            number, negative = repr(abs(value)), value < 0
        else:       # no arithmetic: abs() and < round and trap in the context (Overflow)
            if value and not -400 < value.adjusted() < 400:
                raise DataError(f"{where} is out of range: a number's magnitude must lie "
                                "between 1e-400 and 1e400 (or be 0)")
            number, negative = str(value.copy_abs()), value.is_signed() and bool(value)
    else:
        raise ProgrammingError(f"{where} has type {type(value).__name__}; dpsql binds int, "
                               "float, str and decimal.Decimal")
    node = exp.Literal.number(number)
    return exp.Neg(this=node) if negative else node


#: the characters every placeholder sqlglot reads starts with (``?``, ``:name``, ``$1``)
_PLACEHOLDER_STARTS = "?:$"


class _Template:
    """A batch parsed once; ``bind`` returns its statements with the parameters inlined.
    A text without any character a placeholder starts with has none: it is not parsed
    here (the request parses it, once, where a cancel lands) and binds to itself."""

    def __init__(self, sql: Any):
        if not isinstance(sql, str):
            raise ProgrammingError(f"the operation must be SQL text (str), got "
                                   f"{type(sql).__name__}")
        self.sql = sql
        self.statements: list = []
        self.count = 0
        if not any(c in sql for c in _PLACEHOLDER_STARTS):
            return
        with _backend():
            self.statements = split_statements(sql)
        for stmt in self.statements:
            for node in stmt.find_all(exp.Placeholder, bfs=False):
                if node.this is not None:
                    raise ProgrammingError(
                        f"placeholder {node.sql()!r} is not supported: paramstyle is 'qmark', "
                        "write ? for each parameter and pass a sequence")
                self.count += 1

    def bind(self, parameters: Any) -> str | list[str]:
        if parameters is None:
            parameters = ()
        if isinstance(parameters, (str, bytes, bytearray)) or not isinstance(parameters,
                                                                              Sequence):
            raise ProgrammingError(
                f"parameters must be a sequence (tuple or list) for paramstyle 'qmark', got "
                f"{type(parameters).__name__}")
        if len(parameters) != self.count:
            raise ProgrammingError(f"the SQL has {self.count} placeholder(s) but "
                                   f"{len(parameters)} parameter(s) were given")
        if self.count == 0:
            return self.sql                      # submitted as written (ledger, positions)
        values = iter(parameters)
        position = 0
        bound = []
        for stmt in self.statements:
            tree = stmt.copy()
            # depth-first in argument order: the placeholders' order in the text
            for node in list(tree.find_all(exp.Placeholder, bfs=False)):
                position += 1
                if node is tree:
                    raise ProgrammingError("a whole statement cannot be a parameter")
                node.replace(_literal(next(values), position))
            bound.append(tree)
        texts = [tree.sql(dialect="duckdb") for tree in bound]
        marks = pieces(self.sql)   # workload markers stay as written (sqlglot quotes END)
        if len(marks) == len(texts):
            texts = [m.text if m.marker else t for m, t in zip(marks, texts)]
            bound = [None if m.marker else tree for m, tree in zip(marks, bound)]
        # post-condition: the text parses back to exactly the bound trees
        with _backend():
            again = split_statements(texts)
        if len(again) != len(bound) or any(b is not None and a != b
                                           for a, b in zip(again, bound)):
            raise InterfaceError("the parameters could not be bound exactly as literals; "
                                 "nothing was submitted")
        return texts
