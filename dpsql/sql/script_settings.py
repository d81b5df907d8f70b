"""A script's settings: ``SET dpsql.<name> = <value>`` and a statement's ``WITH
DIFFERENTIAL_PRIVACY OPTIONS``, read through the one settings declaration
(:mod:`dpsql.request.declared`). Pure: no database; :mod:`dpsql.sql.script` groups the
statements and applies these.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import DpsqlError, ParseError, PrivacyParameterError, UnsupportedQueryError
from dpsql.sql import bigquery
from dpsql.sql.refusals import _position

#: the fields of a workload that hold an accuracy target (the declaration's targets:
#: :data:`dpsql.request.declared.TARGETS`, which the settings' tests check against)
TARGETS = ("target_rmse", "max_stderr")


def _allowed(declared) -> str:
    names = [f"dpsql.{name}" for name in declared]
    return "a script may set " + ", ".join(names[:-1]) + f" or {names[-1]}"


def check_asks(epsilon, target_rmse, max_stderr, where: str = "") -> None:
    """At most one of epsilon and the accuracy targets among the caller's defaults."""
    given = [n for n, v in zip(("epsilon", *TARGETS), (epsilon, target_rmse, max_stderr))
             if v is not None]
    if len(given) > 1:
        raise PrivacyParameterError(
            f"{' and '.join(given)} are both given{where}; a request asks either by epsilon "
            "or by an accuracy target (target_rmse or max_stderr, which spends the smallest "
            "epsilon meeting it), not both; drop one")


def _with_options(settings: dict, group: list, declared: dict, was_set) -> dict:
    """A workload's settings with its statements' ``WITH DIFFERENTIAL_PRIVACY OPTIONS``
    (:mod:`dpsql.sql.bigquery`), which override the caller's defaults like a SET; a setting
    the script SET (``was_set``) is kept, and the request refuses an option that differs."""
    out = dict(settings)
    for st in group:
        for _, name, raw, *_ in bigquery.options(st.normalized):
            if name in declared and name not in was_set:
                out[name] = declared[name].parse(raw, "script")
    return out


def _apply_set(st, current: dict, declared: dict, asked: dict) -> set:
    """Apply one SET (a script Statement); return the names it set. ``asked``: which of
    epsilon / the accuracy targets were set since the last query (two different ones for
    the same queries are refused)."""
    names = set()
    node = st.expr
    if node.args.get("unset") or node.args.get("tag") or not node.expressions:
        raise UnsupportedQueryError(f"this SET form is not supported; {_allowed(declared)}",
                                    st.line, st.column)
    for item in node.expressions:
        line, col = _position(item)
        line, col = (line, col) if line is not None else (st.line, st.column)
        kind = item.args.get("kind")
        if kind:
            raise UnsupportedQueryError(
                f"SET {str(kind).upper()} is not supported; write SET dpsql.<name> = <value>",
                st.line, st.column)
        eq = item.this
        target = eq.this if isinstance(eq, exp.EQ) else None
        if not isinstance(target, exp.Column) or target.args.get("db") \
                or target.args.get("catalog"):
            raise UnsupportedQueryError(f"this SET is not supported; {_allowed(declared)}",
                                        line, col)
        name = target.name.lower()
        setting = declared.get(name) if target.table.lower() == "dpsql" else None
        if setting is None:
            raise UnsupportedQueryError(
                f"SET {target.sql()} is not a dpsql setting; {_allowed(declared)}", line, col)
        value = eq.expression
        vline, vcol = _position(value)
        at = (vline, vcol) if vline is not None else (line, col)
        if setting.ask:
            other = next((k for k in asked if k != name), None)
            if other is not None:
                raise ParseError(
                    f"dpsql.{name} and dpsql.{other} (line {asked[other][0]}) are both set "
                    "for the same queries; a workload asks either by epsilon or by an "
                    "accuracy target (dpsql.target_rmse or dpsql.max_stderr), not both; "
                    "remove one", *at)
            asked[name] = (line, col)
        try:
            current[name] = setting.parse(_value_text(value, setting, f"dpsql.{name}"),
                                          "script")
        except DpsqlError as exc:
            raise ParseError(str(exc), *at) from None
        if setting.ask:   # the workload asks by this one from now on
            current.update({k: None for k, s in declared.items() if s.ask and k != name})
        names.add(name)
    return names


def _value_text(node, setting, name: str) -> str:
    """The text of a SET's value for the setting's parser. SQL's own literals carry the
    kind: a number literal for a number, TRUE / FALSE for a flag, a quoted string for
    text; any other form is refused with the setting's own message (or, for text, a
    request to quote it)."""
    shown = repr(node.this) if isinstance(node, exp.Literal) and node.is_string \
        else repr(node.sql())
    if setting.kind == "flag":
        if isinstance(node, exp.Boolean):
            return "true" if node.this else "false"
        raise setting.refusal(name, shown)
    if setting.kind == "number":
        sign = ""
        if isinstance(node, exp.Neg):
            sign, node = "-", node.this
        if isinstance(node, exp.Literal) and not node.is_string:
            return sign + str(node.this)
        raise setting.refusal(name, shown)
    if not (isinstance(node, exp.Literal) and node.is_string):
        hint = f"'{node.sql()}'" if isinstance(node, (exp.Var, exp.Column)) else "'...'"
        raise ParseError(f"{name} must be a string literal, e.g. SET {name} = {hint}")
    return str(node.this)
