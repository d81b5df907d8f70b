"""BigQuery's differential privacy syntax, read from sqlglot's tokens (sqlglot does not parse it).

Two constructs, each turned into dpsql's own before a statement is parsed
(:func:`rewrite`, called by :func:`dpsql.sql.parse.split_statements`), with every other
character kept in place so that errors still point at the right line and column:

- ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6,
  privacy_unit_column = id) …``: the clause is blanked out of the statement; its options are
  read by :func:`options` and become settings of the request through the one settings
  declaration (:class:`dpsql.request.value.Request`), except ``privacy_unit_column``, which
  must name the table's declared privacy unit (:func:`check_unit`), and
  ``max_groups_contributed``, which is refused (the data owner bounds rows per unit);
- ``ANON_SUM(col CLAMPED BETWEEN lo AND hi)`` / ``ANON_AVG(…)``: ``CLAMPED BETWEEN`` and
  ``AND`` become commas, i.e. ``ANON_SUM(col, lo, hi)`` (:mod:`dpsql.sql.aggregates`).

Pure: the query text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sqlglot
from sqlglot.tokens import TokenType

from dpsql.errors import ParseError

#: options that are not request settings: checked against the policy by :func:`check_unit`
POLICY_OPTIONS = ("privacy_unit_column", "max_groups_contributed")


@dataclass(frozen=True)
class Clause:
    """One ``WITH DIFFERENTIAL_PRIVACY [OPTIONS (...)]`` clause: which statement (counted by
    semicolons), its character span, and its options as typed (name lower case -> text)."""

    statement: int
    start: int
    end: int                  # one past the clause's last character
    options: tuple            # ((name, value text, line, column), ...)


def _tokens(text: str) -> list:
    try:
        return list(sqlglot.Dialect.get_or_raise("duckdb").tokenize(text))
    except sqlglot.errors.TokenError:
        return []             # split_statements reports the text's own error


def clauses(text: str) -> list[Clause]:
    """Every differential privacy clause of ``text``."""
    toks, out, statement = _tokens(text), [], 0
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.token_type == TokenType.SEMICOLON:
            statement += 1
        elif (t.token_type == TokenType.SELECT and i + 2 < len(toks)
              and toks[i + 1].token_type == TokenType.WITH
              and toks[i + 2].text.upper() == "DIFFERENTIAL_PRIVACY"):
            clause, i = _clause(text, toks, i + 1, statement)
            out.append(clause)
            continue
        i += 1
    return out


def _clause(text: str, toks: list, i: int, statement: int) -> tuple[Clause, int]:
    """The clause starting at token ``i`` (WITH), and the index of the token after it."""
    start, j = toks[i].start, i + 2
    options: list = []
    if j < len(toks) and toks[j].text.upper() == "OPTIONS":
        if j + 1 >= len(toks) or toks[j + 1].token_type != TokenType.L_PAREN:
            raise _error("OPTIONS must be followed by (name = value, ...)", toks[j])
        j += 2
        while j < len(toks) and toks[j].token_type != TokenType.R_PAREN:
            j = _option(text, toks, j, options)
        if j >= len(toks):
            raise _error("OPTIONS ( is not closed", toks[i])
        return Clause(statement, start, toks[j].end + 1, tuple(options)), j + 1
    return Clause(statement, start, toks[i + 1].end + 1, ()), i + 2


def _option(text: str, toks: list, j: int, options: list) -> int:
    """Read ``name = value`` at token ``j``; return the index after its comma."""
    name = toks[j]
    if name.token_type not in (TokenType.VAR,) and not name.text.isidentifier():
        raise _error(f"expected an option name, got {name.text!r}", name)
    if j + 1 >= len(toks) or toks[j + 1].token_type != TokenType.EQ:
        raise _error(f"option {name.text} needs = value", name)
    k = j + 2
    while k < len(toks) and toks[k].token_type not in (TokenType.COMMA, TokenType.R_PAREN):
        k += 1
    if k == j + 2:
        raise _error(f"option {name.text} has no value", name)
    value = toks[j + 2:k]
    raw = (value[0].text if len(value) == 1 and value[0].token_type == TokenType.STRING
           else text[value[0].start:value[-1].end + 1])
    options.append((name.text.lower(), raw, name.line, name.col - len(name.text) + 1))
    return k + 1 if k < len(toks) and toks[k].token_type == TokenType.COMMA else k


def _error(message: str, tok) -> ParseError:
    return ParseError(f"WITH DIFFERENTIAL_PRIVACY: {message}", tok.line,
                      tok.col - len(tok.text) + 1)


def rewrite(text: str) -> str:
    """``text`` with every differential privacy clause blanked (newlines kept) and every
    ``CLAMPED BETWEEN lo AND hi`` written ``, lo, hi``: same length, same positions."""
    upper = text.upper()
    if "DIFFERENTIAL_PRIVACY" not in upper and "CLAMPED" not in upper:
        return text
    chars = list(text)

    def blank(a: int, b: int, lead: str = "") -> None:
        for p in range(a, b):
            if chars[p] != "\n":
                chars[p] = " "
        if lead:
            chars[a] = lead

    for c in clauses(text):
        blank(c.start, c.end)
    toks = _tokens(text)
    for i, t in enumerate(toks[:-1]):
        if t.text.upper() == "CLAMPED" and toks[i + 1].token_type == TokenType.BETWEEN:
            blank(t.start, toks[i + 1].end + 1, ",")
            depth = 0
            for u in toks[i + 2:]:
                depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(u.token_type, 0)
                if depth == 0 and u.token_type == TokenType.AND:
                    blank(u.start, u.end + 1, ",")
                    break
                if depth < 0:
                    break
    return "".join(chars)


def options(sql: str | Sequence[str]) -> list[tuple]:
    """Every option of the batch's clauses: ``(statement, name, value text, line, col)``."""
    texts = [sql] if isinstance(sql, str) else list(sql or ())
    out, base = [], 0
    for text in texts:
        if not isinstance(text, str) or "DIFFERENTIAL_PRIVACY" not in text.upper():
            base += 1
            continue
        found = clauses(text)
        for c in found:
            out += [(base + c.statement, *opt) for opt in c.options]
        base += 1 + max([c.statement for c in found], default=0)
    return out


def check_unit(sql, policy) -> None:
    """``privacy_unit_column`` must name the table's declared privacy unit (the data owner's
    choice, not the analyst's); ``max_groups_contributed`` is refused. Before any charge."""
    for _, name, value, line, col in options(sql):
        if name == "max_groups_contributed":
            raise ParseError("WITH DIFFERENTIAL_PRIVACY: max_groups_contributed is not "
                             "supported; the data owner bounds each unit's rows "
                             "(max_rows_per_unit in the policy); drop the option", line, col)
        if name == "privacy_unit_column" and value.strip('"').lower() != (
                policy.privacy_unit or ""):
            declared = (f"declares privacy unit {policy.privacy_unit!r}" if policy.privacy_unit
                        else "declares no privacy unit (each row is a unit)")
            raise ParseError(f"WITH DIFFERENTIAL_PRIVACY: privacy_unit_column = {value} does "
                             f"not match the policy: table {policy.table!r} {declared}; the "
                             "data owner declares it; drop the option or name that column",
                             line, col)


def with_clause(normalized: str, original: str) -> str:
    """``normalized`` (sqlglot's text of a statement, the clause blanked away) with the
    original statement's differential privacy clause put back after its first SELECT, so
    that a script's statement keeps its options."""
    found = clauses(original)
    if not found:
        return normalized
    clause = " ".join(original[found[0].start:found[0].end].split())
    for t in _tokens(normalized):
        if t.token_type == TokenType.SELECT:
            return normalized[:t.end + 1] + " " + clause + normalized[t.end + 1:]
    return normalized
