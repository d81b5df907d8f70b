"""A raw value's unit and part, as sqlglot expressions rendered alike for DuckDB and Spark.

The rules are those of :mod:`dpsql.workload` (clamping, the step grid, ``other``, NULL), written
with constructs both dialects evaluate identically on every value, so that the same rows give
the same cells in either engine:

- **One number grammar.** A text value is a number when, after ASCII whitespace, it reads
  ``[+-]digits[.digits][(e|E)[+-]digits]`` (or ``.digits`` …), ``[+-]inf``, ``[+-]infinity``
  or ``[+-]nan`` (the words in any case); its value is the correctly rounded double (±inf
  beyond the range, 0 below it). Anything else (``1_000``, ``0x10``, ``1.5d``, ``''``) is no
  number: it falls in the column's NULL unit (numeric and integer domains; the lowest unit
  when not nullable) or ``other`` (integer categories), exactly as a NULL would. The
  grammar is matched with a regular expression both engines read the same way (RE2 and
  Java: ASCII classes, ``\\A`` … ``\\z``) before any cast, so neither engine's own, wider
  reading of numbers (DuckDB: ``1_000``; Spark: ``1.5d``) ever applies.
- **Clamp before every cast.** A double is clamped into ``[0, top]`` before ``FLOOR`` and the
  cast to BIGINT, and an integer category is cast to BIGINT only when it lies in the BIGINT
  range and is integral: no value (NaN, ±inf, 1e308) reaches a cast that could fail or
  differ (Spark's ``CAST(NaN AS BIGINT)`` is 0; DuckDB's fails).
- **Lists by position, parts by comparisons.** A declared value's position comes from
  ``ARRAY_POSITION`` (DuckDB: NULL when absent; Spark: 0, hence the ``NULLIF``); a unit's
  part from ``WHEN unit < k`` runs, never from list indexing (1-based in DuckDB, 0-based
  in Spark's brackets: sqlglot can shift the index only when it can type it).
- **Doubles as text.** Every double constant is ``CAST('<repr>' AS DOUBLE)``, parsed by each
  engine's correctly rounded reader (a decimal literal would be DECIMAL in both, converted
  differently); a DECIMAL column is read the same way, through its digits.

The column's SQL type only chooses how a value is read (:func:`kind`): text through the
grammar, numbers and booleans by a cast to DOUBLE, anything else as no number. Called by
:mod:`dpsql.engines.query`; public code only (no data, no connection).
"""

from __future__ import annotations

import numpy as np
from sqlglot import exp

from dpsql.errors import EngineError
from dpsql.workload.categorical import CategoricalDomain
from dpsql.workload.ordered import IntegerDomain, NumericDomain

TEXT, INTEGER, FLOAT, DECIMAL, BOOLEAN, OTHER = ("text", "integer", "float", "decimal",
                                                 "boolean", "other")

_TEXT_TYPES = ("varchar", "string", "text", "char", "bpchar", "nvarchar")
_INTEGER_TYPES = ("tinyint", "smallint", "integer", "int", "bigint", "hugeint", "utinyint",
                  "usmallint", "uinteger", "ubigint", "uhugeint", "long", "short", "byte",
                  "int1", "int2", "int4", "int8", "int16", "int32", "int64", "int128")
_FLOAT_TYPES = ("float", "double", "real", "float4", "float8")
_DECIMAL_TYPES = ("decimal", "numeric", "dec")
_BOOLEAN_TYPES = ("boolean", "bool", "logical")

_WS = r"[ \t\n\r\x0B\x0C]*"
_EXP = r"(?:[eE][+-]?[0-9]+)?"
#: the one number grammar: group 1 is the number's text without the surrounding whitespace
NUMBER = (rf"\A{_WS}([+-]?(?:[0-9]+(?:[.][0-9]*)?{_EXP}|[.][0-9]+{_EXP}|"
          rf"[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN])){_WS}\z")
_INTEGER_TEXT = r"\A[+-]?[0-9]+\z"
_TWO_63 = 2.0 ** 63


def kind(sql_type: str | None) -> str:
    """How a column of this SQL type (DuckDB's or Spark's spelling) is read: ``text``,
    ``integer``, ``float``, ``decimal``, ``boolean`` or ``other`` (dates, lists, …)."""
    t = (sql_type or "").strip().lower()
    if any(c in t for c in "[<") or t.startswith(("struct", "map", "union", "array")):
        return OTHER
    base = t.split("(")[0].strip()
    for name, types in ((TEXT, _TEXT_TYPES), (INTEGER, _INTEGER_TYPES), (FLOAT, _FLOAT_TYPES),
                        (DECIMAL, _DECIMAL_TYPES), (BOOLEAN, _BOOLEAN_TYPES)):
        if base in types or (name == TEXT and base.startswith(("varchar", "char"))):
            return name
    return OTHER


# ------------------------------------------------------------------ constants

def integer(value: int) -> exp.Expression:
    return exp.Literal.number(int(value)) if value >= 0 else \
        exp.Neg(this=exp.Literal.number(-int(value)))


def double(value: float) -> exp.Expression:
    """A double constant, read by the engine's own correctly rounded parser."""
    return exp.cast(exp.Literal.string(repr(float(value))), "DOUBLE")


def _regexp_like(value: exp.Expression, pattern: str) -> exp.Expression:
    return exp.RegexpLike(this=value, expression=exp.Literal.string(pattern))


def _case(whens, default) -> exp.Expression:
    """``CASE WHEN … THEN … [ELSE …] END`` built in one go: sqlglot's ``Case.when`` copies
    the whole expression at every call, so a column of 1,500 parts took 5.9 s (of an 8-s
    release of 2,000 ranges) to map; each condition and value is still copied once."""
    ifs = [exp.If(this=exp.maybe_parse(condition, copy=True),
                  true=exp.maybe_parse(then, copy=True)) for condition, then in whens]
    return exp.Case(ifs=ifs, default=None if default is None
                    else exp.maybe_parse(default, copy=True))


def _null(sql_type: str) -> exp.Expression:
    return exp.cast(exp.null(), sql_type)


# ------------------------------------------------------------------ reading a value
#
# A column is mapped in four steps, each a projection over the one before (so no step is
# evaluated twice per row): the grammar's token of a text value (:func:`token`), the value
# the domain reads (:func:`value`: a DOUBLE, an exact BIGINT or the text), its unit
# (:func:`unit`), then the part (:func:`part`).

def reads_numbers(domain) -> bool:
    """Whether the domain reads its column as a number (all but text categories)."""
    return not (isinstance(domain, CategoricalDomain) and isinstance(domain.values[0], str))


def needs_token(domain, how: str) -> bool:
    return how == TEXT and reads_numbers(domain)


def token(column: exp.Expression) -> exp.Expression:
    """A text value's number under the one grammar, as text ('' when it is no number)."""
    return exp.RegexpExtract(this=column, expression=exp.Literal.string(NUMBER),
                             group=exp.Literal.number(1))


def _number(raw: exp.Expression, tok: exp.Expression | None, how: str) -> exp.Expression:
    """The value as a DOUBLE, or NULL (NULL, or no number under the one grammar)."""
    if how in (INTEGER, FLOAT, BOOLEAN):
        return exp.cast(raw, "DOUBLE")
    if how == DECIMAL:      # through its exact digits: both parsers round correctly
        return exp.TryCast(this=exp.cast(raw, "VARCHAR"), to=exp.DataType.build("DOUBLE"),
                           safe=True)
    if how != TEXT:
        return _null("DOUBLE")
    parsed = exp.TryCast(this=exp.Nullif(this=tok.copy(), expression=exp.Literal.string("")),
                         to=exp.DataType.build("DOUBLE"), safe=True)
    # NaN in any case and with any sign (Spark's cast reads only an unsigned 'nan')
    return _case([(_regexp_like(tok.copy(), "[aA]"), double(float("nan")))], parsed)


def _exact_integer(raw: exp.Expression, tok: exp.Expression | None,
                   how: str) -> exp.Expression:
    """The value as a BIGINT when it is exactly an integer in BIGINT's range, else NULL."""
    if how == INTEGER:
        return exp.TryCast(this=raw, to=exp.DataType.build("BIGINT"), safe=True)
    if how not in (TEXT, FLOAT, DECIMAL, BOOLEAN):
        return _null("BIGINT")

    def d():
        return _number(raw.copy(), tok, how)
    integral = exp.and_(exp.GTE(this=d(), expression=double(-_TWO_63)),
                        exp.LT(this=d(), expression=double(_TWO_63)),
                        exp.EQ(this=d(), expression=exp.Floor(this=d())))
    from_double = _case([(integral, exp.cast(d(), "BIGINT"))], None)
    if how != TEXT:
        return from_double
    # digits alone: read exactly (a double would round past 2**53)
    return _case([(_regexp_like(tok.copy(), _INTEGER_TEXT),
                   exp.TryCast(this=tok.copy(), to=exp.DataType.build("BIGINT"), safe=True))],
                 from_double)


def value(raw: exp.Expression, tok: exp.Expression | None, domain,
          how: str) -> exp.Expression:
    """What the domain reads from a raw value: a DOUBLE (integer and numeric domains), an
    exact BIGINT (integer categories) or the text (text categories); NULL for NULL and for
    what is no number. ``tok``: the :func:`token` column when :func:`needs_token`."""
    if not reads_numbers(domain):
        return raw if how == TEXT else exp.cast(raw, "VARCHAR")
    if isinstance(domain, CategoricalDomain):
        return _exact_integer(raw, tok, how)
    return _number(raw, tok, how)


def value_units(raw: exp.Expression, how: str, exponent: int, lo_units: int,
                hi_units: int) -> exp.Expression:
    """One row's bounded value in whole units ``u = 2**exponent`` (BIGINT, never NULL): the
    value read as a number (the one grammar for text, :func:`_number`) clamped to
    ``[lo_units·u, hi_units·u]`` on doubles, scaled, rounded half away from zero (both
    engines' ``ROUND``) and clamped again as an integer; NaN reads as the upper bound (it
    sorts above every number in both engines); NULL or no number adds 0. Bounds and scale
    are powers of two times integers, exact as doubles, so no value can make a cast fail."""
    tok = token(raw.copy()) if how == TEXT else None

    def v() -> exp.Expression:
        return _number(raw.copy(), tok.copy() if tok is not None else None, how)
    unit = 2.0 ** exponent
    clamped = exp.Least(this=exp.Greatest(this=v(), expressions=[double(lo_units * unit)],
                                          ignore_nulls=True),
                        expressions=[double(hi_units * unit)], ignore_nulls=True)
    scaled = exp.Round(this=exp.Mul(this=clamped, expression=double(2.0 ** -exponent)))
    units = exp.Least(this=exp.Greatest(this=exp.cast(scaled, "BIGINT"),
                                        expressions=[integer(lo_units)], ignore_nulls=True),
                      expressions=[integer(hi_units)], ignore_nulls=True)
    return _case([(exp.Is(this=v(), expression=exp.null()), integer(0))], units)


# ------------------------------------------------------------------ units and parts

def _position(values: list, key: exp.Expression, sql_type: str) -> exp.Expression:
    """0-based position of ``key`` in ``values``, or NULL."""
    items = [exp.Literal.string(v) if isinstance(v, str) else integer(v) for v in values]
    array = exp.Array(expressions=items)
    if sql_type != "VARCHAR":
        array = exp.cast(array, f"ARRAY<{sql_type}>")
    found = exp.ArrayPosition(this=array, expression=key)
    return exp.Sub(this=exp.Nullif(this=found, expression=exp.Literal.number(0)),
                   expression=exp.Literal.number(1))


def unit(raw: exp.Expression, v: exp.Expression, domain,
         unit_to_part: np.ndarray) -> exp.Expression:
    """The unit index (BIGINT, never NULL) of a raw value read as ``v`` (:func:`value`;
    the rule in :mod:`dpsql.workload`). A numeric domain's units are consecutive bins, so
    its *part* is computed here directly: one ``WHEN v < edge`` per change of part (NaN
    compares above every edge in both engines: the last bin, as a clamped +inf)."""
    if isinstance(domain, CategoricalDomain):
        null_unit = domain.null_unit if domain.nullable else domain.other_unit
        found = _position(list(domain.values), v,
                          "VARCHAR" if isinstance(domain.values[0], str) else "BIGINT")
        return _case([(exp.Is(this=raw, expression=exp.null()), integer(null_unit))],
                     exp.Coalesce(this=found, expressions=[integer(domain.other_unit)]))
    if isinstance(domain, IntegerDomain):
        null_unit = domain.null_unit if domain.nullable else 0
        top = domain.n_value_units - 1
        scaled = exp.Div(this=exp.Paren(this=exp.Sub(this=v.copy(),
                                                     expression=double(domain.min))),
                         expression=double(domain.step))
        # clamp *before* FLOOR and the cast: NaN sorts above every number in both engines
        clamped = exp.Least(this=exp.Greatest(this=scaled, expressions=[double(0)],
                                              ignore_nulls=True),
                            expressions=[double(top)], ignore_nulls=True)
        return _case([(exp.Is(this=v, expression=exp.null()), integer(null_unit))],
                     exp.cast(exp.Floor(this=clamped), "BIGINT"))
    if isinstance(domain, NumericDomain):
        top = domain.n_value_units - 1
        null_part = int(unit_to_part[domain.null_unit if domain.nullable else 0])
        whens = [(exp.LT(this=v.copy(), expression=double(domain.edges[u + 1])),
                  integer(int(unit_to_part[u])))
                 for u in range(top) if unit_to_part[u] != unit_to_part[u + 1]]
        last = int(unit_to_part[top])
        if not whens and null_part == last:
            return exp.cast(integer(last), "BIGINT")
        return _case([(exp.Is(this=v.copy(), expression=exp.null()), integer(null_part))]
                     + whens, integer(last))
    raise EngineError("internal error: unknown domain type")


def part(u: exp.Expression, domain, unit_to_part: np.ndarray) -> exp.Expression:
    """The part of a value whose :func:`unit` is ``u``: ``unit_to_part[u]``, written as one
    ``WHEN u < k`` per change of part along the units (no list indexing, whose base differs
    between dialects); a numeric domain's :func:`unit` is already its part."""
    mapping = np.asarray(unit_to_part)
    if isinstance(domain, NumericDomain) or np.array_equal(mapping, np.arange(len(mapping))):
        return u
    whens = [(exp.LT(this=u.copy(), expression=integer(k + 1)), integer(int(mapping[k])))
             for k in range(len(mapping) - 1) if mapping[k] != mapping[k + 1]]
    if not whens:
        return exp.cast(integer(int(mapping[-1])), "BIGINT")
    return _case(whens, integer(int(mapping[-1])))


def groups_by_raw_value(domain, how: str) -> bool:
    """Whether the query groups ``domain``'s column by its raw value before mapping it.

    Grouping by the raw column is as cheap as a plain GROUP BY (dictionary-compressed text
    is grouped without looking at the strings), and the unit rule then runs once per
    distinct value instead of once per row. That pays for columns with few distinct values,
    which is what categorical and step-1 integer domains declare; numeric domains (and
    integer ones with a step, or any domain over a floating-point or decimal column) usually
    sit on columns with a value per row, so their part is computed per row. Either way the
    counts are the same: only the speed depends on this choice.

    Trade-off: a categorical or step-1 integer domain declared over a column with about one
    value per row (an id) makes the inner GROUP BY as slow as a plain GROUP BY of that
    column (about 0.9 s instead of 0.1 s per 10 million rows on 2 cores, DuckDB).
    """
    if how in (FLOAT, DECIMAL):
        return False
    if isinstance(domain, CategoricalDomain):
        return True
    return isinstance(domain, IntegerDomain) and domain.step == 1


def refusal(name: str, domain, how: str) -> str | None:
    """Why a Spark column cannot be read under its declared domain, or None.

    The rules above read numbers, text, integers and booleans alike in both engines. Two
    readings would differ: a text category over a floating-point, date or other column
    compares the engine's own text form of the value (DuckDB writes ``1e+20``, Spark
    ``1.0E20``), and nested types (lists, maps, structs) have no agreed form at all."""
    if how == OTHER and not isinstance(domain, CategoricalDomain):
        return None        # never a number: its NULL unit, in both engines
    if isinstance(domain, CategoricalDomain) and isinstance(domain.values[0], str) \
            and how in (FLOAT, DECIMAL, OTHER):
        return (f"column {name!r} holds non-text values; its declared text categories would "
                "compare Spark's text form of each value, which differs from DuckDB's; "
                "declare a numeric or integer domain, or cast the column to text in a view")
    return None
