"""Literal constants of a condition: strings, integers and exact decimals, within guards.

Numbers arrive as ASCII decimal text only: sqlglot's tokenizer reads a number from ``0-9``
alone (``_`` digit separators dropped; ``١`` is read as an identifier, never as a number), and
DB-API parameters are bound as the ASCII text of an int, float or Decimal. A decimal is
held exactly (``Fraction``), never as a float; an exponent beyond :data:`MAX_EXPONENT` is
refused before the number is built.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.sql.refusals import _reject

#: limits that keep parsing and compiling cheap (explain is free, so it must stay fast)
#: literals with a decimal exponent beyond this are refused (see _literal)
MAX_EXPONENT = 400
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)$")


def _literal(node: exp.Expression, at: exp.Expression | None = None) -> Any:
    """A constant: string, integer, or exact decimal (as Fraction).

    ``at`` is the enclosing condition, to point at when the constant carries no position.
    """
    neg = False
    if isinstance(node, exp.Neg):
        neg, node = True, node.this
    if isinstance(node, exp.Paren):
        return _literal(node.this, at) if not neg else -_literal(node.this, at)
    if isinstance(node, exp.Literal):
        if node.is_string:
            if neg:
                raise _reject("negating a string", node, at=at)
            return str(node.this)
        text = str(node.this)
        value = number(text)
        if value is None:
            exponent = _EXPONENT.search(text)
            if exponent is not None and abs(int(exponent.group(1))) > MAX_EXPONENT:
                # Fraction('1e100000000') would build a 100-million-digit integer (minutes,
                # with the database held); no declared domain needs such a number
                raise _reject(f"number {text[:40]!r} (exponent beyond ±{MAX_EXPONENT})",
                              node, at=at)
            raise _reject(f"number {text!r}", node, at=at)
        return -value if neg else value
    if isinstance(node, exp.Null):
        raise _reject("comparison with NULL", node,
                      "it is never true in SQL; use IS NULL or IS NOT NULL", at=at)
    if isinstance(node, exp.Placeholder):
        raise _reject("an unbound parameter placeholder", node,
                      "bind parameters before submitting", at=at)
    raise _reject(f"expression {node.sql()!r}", node,
                  "compare a column with a literal constant", at=at)


def number(text: str) -> Any:
    """A number literal's value (integer, or exact decimal as Fraction) from its text, or
    None when :func:`_literal` refuses it (it says why)."""
    if text.isdecimal():           # digits alone (the common case): no exponent, an int
        return int(text)
    exponent = _EXPONENT.search(text)
    if exponent is not None and abs(int(exponent.group(1))) > MAX_EXPONENT:
        return None
    try:
        value: Any = int(text) if text.lstrip("-").isdigit() else Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    if isinstance(value, Fraction) and value.denominator == 1:
        value = int(value)
    return value
