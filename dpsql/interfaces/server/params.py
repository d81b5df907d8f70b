"""Extended-query parameters (``$1``, ``$2`` …) bound as SQL literals.

Each parameter is decoded from its wire format (text, or binary for the integer, float,
boolean and text types) and written into the statement as a literal: numbers checked to be
plain numbers, everything else a quoted string (quotes doubled). The statement then takes
the same path as a simple query, so a bound value can never become SQL.
"""

from __future__ import annotations

import re
import struct

import sqlglot
from sqlglot.tokens import TokenType

from dpsql.errors import ParseError, UnsupportedQueryError

NUMERIC_OIDS = {20, 21, 23, 26, 700, 701, 1700}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_BINARY = {21: "!h", 23: "!i", 20: "!q", 26: "!I", 700: "!f", 701: "!d"}


def decode(raw: bytes | None, oid: int, binary: bool):
    """One parameter as a Python value (None for NULL)."""
    if raw is None:
        return None
    if binary:
        if oid in _BINARY:
            return struct.unpack(_BINARY[oid], raw)[0]
        if oid == 16:
            return raw == b"\x01"
        if oid in (0, 25, 1043, 19, 705):
            return raw.decode("utf-8")
        raise UnsupportedQueryError(f"a binary parameter of type oid {oid} is not supported; "
                                    "send it in text format")
    text = raw.decode("utf-8")
    if oid == 16:
        return text.lower() in ("t", "true", "1", "on", "yes")
    if oid in NUMERIC_OIDS:
        if not _NUMBER.match(text.strip()):
            raise ParseError("a numeric parameter is not a number; pass a plain number")
        return float(text) if any(c in text for c in ".eE") else int(text)
    return text


def literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        text = repr(value)
        if not _NUMBER.match(text):
            raise ParseError("a parameter is not a finite number; pass a finite number")
        return text
    return "'" + str(value).replace("'", "''") + "'"


def bind(sql: str, values: list) -> str:
    """``sql`` with each ``$n`` replaced by the literal of ``values[n-1]``."""
    if not values:
        return sql
    try:
        tokens = sqlglot.tokenize(sql, read="postgres")
    except sqlglot.errors.TokenError:
        raise ParseError("the statement could not be read to bind its parameters") from None
    if tokens and tokens[0].token_type == TokenType.COMMAND:    # CALL ...: the rest is text
        cut = tokens[0].end + 1
        return sql[:cut] + bind(sql[cut:], values)
    out, last = [], 0
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.PARAMETER and i + 1 < len(tokens):
            nxt = tokens[i + 1]
            if nxt.start == tok.end + 1 and nxt.text.isdigit():
                n = int(nxt.text)
                if not 1 <= n <= len(values):
                    raise ParseError(f"parameter ${n} has no value ({len(values)} given)")
                out.append(sql[last:tok.start] + literal(values[n - 1]))
                last = nxt.end + 1
        elif tok.token_type == TokenType.PLACEHOLDER and tok.text.startswith("$"):
            n = int(tok.text[1:]) if tok.text[1:].isdigit() else 0
            if not 1 <= n <= len(values):
                raise ParseError(f"parameter {tok.text} has no value ({len(values)} given)")
            out.append(sql[last:tok.start] + literal(values[n - 1]))
            last = tok.end + 1
    return "".join(out) + sql[last:]
