"""Split a reporting script into workloads with their settings and release names.

Pure: no database. The rules (workloads, settings, release names) are documented in
:mod:`dpsql.scripts` and ``docs/scripts.md``; :mod:`dpsql.scripts` checks and runs the result.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from fractions import Fraction

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from ..accounting import validate_delta, validate_epsilon
from ..errors import DpsqlError, ParseError, PrivacyParameterError, UnsupportedQueryError
from ..noise import CALIBRATIONS
from ..strategies import spec as strategy_spec
from .parse import _position, split_statements

SETTINGS = ("epsilon", "delta", "strategy", "calibration", "model", "release")
MODELS = ("dp", "metric")
MAX_RELEASE_NAME = 200
_ALLOWED_SETS = ("a script may set " + ", ".join(f"dpsql.{s}" for s in SETTINGS[:-1])
                 + f" or dpsql.{SETTINGS[-1]}")


def check_model(value) -> str:
    """The privacy model of a request: ``dp`` (differential privacy, the default) or
    ``metric`` (d_X privacy under the table's declared metric; epsilon per unit distance,
    charged to its metric budget; delta must be 0)."""
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in MODELS:
        raise PrivacyParameterError(
            f"model must be 'dp' (differential privacy) or 'metric' (d_X privacy under the "
            f"table's declared metric), got {value!r}")
    return name


class ScriptError(DpsqlError):
    """A script was refused or stopped. ``released``: what it released before stopping."""

    def __init__(self, message: str, *, workload: int | None = None, released=(),
                 line: int | None = None, column: int | None = None):
        super().__init__(" ".join(message.split("\n")))
        self.workload = workload
        self.released = tuple(released)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class Statement:
    expr: exp.Expression
    start: int                   # offset of the first token
    end: int                     # offset just past the last token
    semicolon: int | None        # offset of the ';' that ends it
    line: int
    column: int
    end_line: int
    normalized: str              # sqlglot's DuckDB text, without comments


@dataclass(frozen=True)
class ScriptWorkload:
    number: int                  # from 1
    statements: tuple            # Statement, the queries only
    epsilon: Fraction
    delta: Fraction
    strategy: str
    calibration: str
    name: str                    # release name
    named_by: str                # "script" (SET dpsql.release), "caller" or "digest"
    model: str = "dp"            # "dp" or "metric" (d_X: epsilon per unit distance)

    @property
    def sql(self) -> list[str]:
        return [s.normalized for s in self.statements]

    @property
    def lines(self) -> str:
        a, b = self.statements[0].line, self.statements[-1].end_line
        return f"line {a}" if a == b else f"lines {a}-{b}"

    @property
    def label(self) -> str:
        return f"workload {self.number} ({self.lines})"

    def params(self) -> dict:
        return dict(epsilon=self.epsilon, delta=self.delta, strategy=self.strategy,
                    calibration=self.calibration, model=self.model)


@dataclass(frozen=True)
class Script:
    text: str
    digest: str                  # SHA-256 of the normalized script
    workloads: tuple             # ScriptWorkload


def parse_script(text: str, *, epsilon=None, delta=None, strategy: str | None = None,
                 calibration: str | None = None, model: str | None = None,
                 release: str | None = None, check_strategy=None) -> Script:
    """Split a script into workloads with their settings and release names (no database).

    ``check_strategy(text) -> str`` validates a strategy setting (options included) and
    raises :class:`~dpsql.errors.StrategyError`; :func:`dpsql.scripts.parse_script` passes
    the full check (:func:`dpsql.scripts.check_strategy`). Without it only the spec's
    syntax is checked here (this module stays public-only)."""
    if not isinstance(text, str):
        raise ParseError("a script must be SQL text")
    check = check_strategy or _spec_syntax
    statements = _split(text)
    current = {"epsilon": None if epsilon is None else validate_epsilon(epsilon),
               "delta": None if delta is None else _delta(delta, "delta"),
               "strategy": "auto" if strategy is None else _strategy(strategy, None, check),
               "calibration": "analytic" if calibration is None
               else _calibration(calibration, None),
               "model": "dp" if model is None else _model(model, None),
               "release": None}
    if release is not None:
        release = _release_name(release, None)
    digest = hashlib.sha256(";\n".join(s.normalized for s in statements).encode()).hexdigest()
    groups: list[tuple[dict, list[Statement]]] = []
    pending_set: Statement | None = None
    for st in statements:
        if isinstance(st.expr, exp.Set):
            _apply_set(st, current, check)
            pending_set = st
        elif isinstance(st.expr, exp.Command) and str(st.expr.this).upper() == "SET":
            raise UnsupportedQueryError(
                f"this SET form is not supported; write SET dpsql.<name> = <value> "
                f"({_ALLOWED_SETS})", st.line, st.column)
        else:
            if pending_set is not None or not groups:
                groups.append((dict(current), []))
            pending_set = None
            groups[-1][1].append(st)
    if pending_set is not None:
        raise UnsupportedQueryError(
            "this SET is followed by no query, so it would have no effect; settings apply to "
            "the queries after them", pending_set.line, pending_set.column)
    if not groups:
        raise ParseError("the script has no query (only settings and comments)")
    workloads = []
    for k, (settings, group) in enumerate(groups, 1):
        label = f"workload {k} ({_lines(group)})"
        for key, flag in (("epsilon", "--epsilon"), ("delta", "--delta")):
            if settings[key] is None:
                raise ScriptError(
                    f"{label}: no {key} given; put SET dpsql.{key} = <value>; before its "
                    f"queries, or give a default ({flag} on the command line)", workload=k)
        base, by = ((release, "caller") if release is not None else
                    (settings["release"], "script") if settings["release"] is not None else
                    (f"script-{digest[:12]}", "digest"))
        workloads.append(ScriptWorkload(k, tuple(group), settings["epsilon"], settings["delta"],
                                        settings["strategy"], settings["calibration"],
                                        f"{base}/{k}", by, settings["model"]))
    return Script(text, digest, tuple(workloads))


def _split(text: str) -> list[Statement]:
    """Statements with their offsets; sqlglot parses the whole text first (syntax errors
    point into the script)."""
    exprs = split_statements(text)
    try:
        tokens = sqlglot.Dialect.get_or_raise("duckdb").tokenize(text)
    except sqlglot.errors.TokenError as exc:  # pragma: no cover - split_statements caught it
        raise ParseError(f"could not read SQL: {exc}") from None
    chunks: list[tuple[list, int | None]] = []
    current: list = []
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if current:
                chunks.append((current, tok.start))
            current = []
        else:
            current.append(tok)
    if current:
        chunks.append((current, None))
    if len(chunks) != len(exprs):
        raise ParseError("could not split the script into statements; end each with ';'")
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def where(offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(line_starts, offset)
        return line, offset - line_starts[line - 1] + 1

    out = []
    for (toks, semicolon), expr in zip(chunks, exprs):
        start, end = toks[0].start, toks[-1].end + 1
        line, col = where(start)
        out.append(Statement(expr, start, end, semicolon, line, col, where(end - 1)[0],
                             expr.sql(dialect="duckdb", comments=False)))
    return out


def _lines(group: list[Statement]) -> str:
    a, b = group[0].line, group[-1].end_line
    return f"line {a}" if a == b else f"lines {a}-{b}"


def _apply_set(st: Statement, current: dict, check_strategy) -> None:
    node = st.expr
    if node.args.get("unset") or node.args.get("tag") or not node.expressions:
        raise UnsupportedQueryError(f"this SET form is not supported; {_ALLOWED_SETS}",
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
            raise UnsupportedQueryError(f"this SET is not supported; {_ALLOWED_SETS}",
                                        line, col)
        name = target.name.lower()
        if target.table.lower() != "dpsql" or name not in SETTINGS:
            raise UnsupportedQueryError(
                f"SET {target.sql()} is not a dpsql setting; {_ALLOWED_SETS}", line, col)
        value = eq.expression
        vline, vcol = _position(value)
        at = (vline, vcol) if vline is not None else (line, col)
        if name in ("epsilon", "delta"):
            number = _number_literal(value)
            if number is None:
                raise ParseError(f"dpsql.{name} must be a number, e.g. SET dpsql.{name} = "
                                 f"{'0.5' if name == 'epsilon' else '1e-6'}", *at)
            try:
                current[name] = (validate_epsilon(number, "dpsql.epsilon") if name == "epsilon"
                                 else _delta(number, "dpsql.delta"))
            except DpsqlError as exc:
                raise ParseError(str(exc), *at) from None
        else:
            if not (isinstance(value, exp.Literal) and value.is_string):
                hint = f"'{value.sql()}'" if isinstance(value, (exp.Var, exp.Column)) else "'...'"
                raise ParseError(f"dpsql.{name} must be a string literal, e.g. "
                                 f"SET dpsql.{name} = {hint}", *at)
            if name == "strategy":
                current[name] = _strategy(str(value.this), at, check_strategy)
                continue
            check = {"calibration": _calibration, "model": _model,
                     "release": _release_name}[name]
            current[name] = check(str(value.this), at)


def _number_literal(node) -> Fraction | None:
    sign = 1
    if isinstance(node, exp.Neg):
        sign, node = -1, node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return sign * Fraction(str(node.this))
        except (ValueError, ZeroDivisionError):
            return None
    return None


def _delta(value, name: str) -> Fraction:
    """delta = 0 is pure epsilon-DP (Laplace noise, or mwem); delta > 0 Gaussian noise."""
    return validate_delta(value, name)


def _spec_syntax(value) -> str:
    """Only the syntax of a strategy spec (the default when no full check is given)."""
    strategy_spec.parse(value)
    return value.strip()


def _strategy(value: str, at, check) -> str:
    try:
        return check(value)
    except DpsqlError as exc:
        raise ParseError(str(exc), *(at or (None, None))) from None


def _model(value: str, at) -> str:
    try:
        return check_model(value)
    except DpsqlError as exc:
        raise ParseError(str(exc), *(at or (None, None))) from None


def _calibration(value: str, at) -> str:
    if value not in CALIBRATIONS:
        raise ParseError(f"calibration must be one of {CALIBRATIONS}, got {value!r}",
                         *(at or (None, None)))
    return value


def _release_name(value: str, at) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_RELEASE_NAME \
            or any(c in value for c in "\n\r\t") or value != value.strip():
        raise ParseError(f"a release name must be a non-empty string of at most "
                         f"{MAX_RELEASE_NAME} characters, without tabs, line breaks or "
                         "surrounding spaces", *(at or (None, None)))
    return value
