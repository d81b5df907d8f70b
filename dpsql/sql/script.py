"""Split a reporting script into workloads with their settings and release names.

Pure: no database. The rules (workloads, settings, release names) are documented in
:mod:`dpsql.interfaces.scripts` and ``docs/scripts.md``; :mod:`dpsql.interfaces.scripts` checks and runs the result.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from dpsql.noise.accounting import validate_delta, validate_epsilon
from dpsql.noise.accounting import to_exact
from dpsql.errors import (DpsqlError, ParseError, PrivacyParameterError, ScriptError,
                          UnsupportedQueryError, show_exact)
from dpsql.noise.gaussian import CALIBRATIONS
from dpsql.strategies import spec as strategy_spec
from dpsql.sql.parse import _position, split_statements

SETTINGS = ("epsilon", "delta", "strategy", "calibration", "model", "target_rmse",
            "max_stderr", "confirm", "nonnegative", "integer", "reuse", "release")
MODELS = ("dp", "metric")
#: how a workload asks: by epsilon, or by an accuracy target (the smallest epsilon meeting it)
ASKS = ("epsilon", "target_rmse", "max_stderr")
TARGETS = ("target_rmse", "max_stderr")
#: true/false settings: confirm (spend what an accuracy target needs), consistency flags,
#: reuse (answer from past releases where they are at least as accurate; on by default)
FLAGS = ("confirm", "nonnegative", "integer", "reuse")
FLAG_DEFAULTS = {"confirm": False, "nonnegative": False, "integer": False, "reuse": True}
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


def check_target(value, name: str = "target_rmse") -> float:
    """An accuracy target (``target_rmse``: the batch's expected RMSE; ``max_stderr``: every
    answer's standard error), in counts: a positive finite number. Returned as a float (what
    :meth:`dpsql.Session.answer` takes)."""
    exact = to_exact(value, name)
    if exact <= 0:
        raise PrivacyParameterError(
            f"{name} must be a positive number (an expected error, in counts), got "
            f"{show_exact(exact)}")
    try:
        number = float(exact)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise PrivacyParameterError(f"{name} is too large to be an expected error: "
                                    f"{show_exact(exact)}")
    return number


def check_flag(value, name: str) -> bool:
    """A true/false setting given as a Python value: ``True`` or ``False`` only."""
    if not isinstance(value, bool):
        raise PrivacyParameterError(f"{name} must be True or False, got {value!r}")
    return value


def check_asks(epsilon, target_rmse, max_stderr, where: str = "", flags: bool = False,
               who: str = "request") -> None:
    """At most one of epsilon and the accuracy targets: a request asks by one of them.
    ``flags``: name them as command-line flags (``--target-rmse``)."""
    given = [n for n, v in zip(ASKS, (epsilon, target_rmse, max_stderr)) if v is not None]
    if flags:
        given = ["--" + n.replace("_", "-") for n in given]
    if len(given) > 1:
        raise PrivacyParameterError(
            f"{' and '.join(given)} are both given{where}; a {who} asks either by epsilon "
            "or by an accuracy target (target_rmse or max_stderr, which spends the smallest "
            "epsilon meeting it), not both; drop one")


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
    epsilon: Fraction | None     # None when the workload asks by an accuracy target
    delta: Fraction
    strategy: str
    calibration: str
    name: str                    # release name
    named_by: str                # "script" (SET dpsql.release), "caller" or "digest"
    model: str = "dp"            # "dp" or "metric" (d_X: epsilon per unit distance)
    target_rmse: float | None = None   # accuracy first: the smallest epsilon meeting it
    max_stderr: float | None = None
    confirm: bool = False        # spend what an accuracy target needs (SET dpsql.confirm)
    nonnegative: bool = False    # consistency post-processing (no privacy cost)
    integer: bool = False
    reuse: bool = True           # answer from past releases where at least as accurate

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

    @property
    def target(self) -> tuple[str, float] | None:
        """``(setting, value)`` of an accuracy-first workload, else None."""
        for key in TARGETS:
            if getattr(self, key) is not None:
                return key, getattr(self, key)
        return None

    def params(self) -> dict:
        """What :meth:`Session.explain` takes: epsilon, or the accuracy target, and reuse."""
        ask = ({"epsilon": self.epsilon} if self.target is None
               else {self.target[0]: self.target[1]})
        return dict(ask, delta=self.delta, strategy=self.strategy,
                    calibration=self.calibration, model=self.model, reuse=self.reuse)

    def answer_params(self) -> dict:
        """What :meth:`Session.answer` takes: :meth:`params` plus confirm and the flags."""
        return dict(self.params(), confirm=self.confirm, nonnegative=self.nonnegative,
                    integer=self.integer)


@dataclass(frozen=True)
class Script:
    text: str
    digest: str                  # SHA-256 of the normalized script
    workloads: tuple             # ScriptWorkload


def parse_script(text: str, *, epsilon=None, delta=None, strategy: str | None = None,
                 calibration: str | None = None, model: str | None = None,
                 release: str | None = None, target_rmse=None, max_stderr=None,
                 confirm: bool | None = None, nonnegative: bool | None = None,
                 integer: bool | None = None, reuse: bool | None = None,
                 check_strategy=None) -> Script:
    """Split a script into workloads with their settings and release names (no database).

    The keyword arguments are the caller's defaults (at most one of ``epsilon``,
    ``target_rmse`` and ``max_stderr``); the script's ``SET`` statements override them.

    ``check_strategy(text) -> str`` validates a strategy setting (options included) and
    raises :class:`~dpsql.errors.StrategyError`; :func:`dpsql.interfaces.scripts.parse_script` passes
    the full check (:func:`dpsql.interfaces.scripts.check_strategy`). Without it only the spec's
    syntax is checked here (this module stays public-only)."""
    if not isinstance(text, str):
        raise ParseError("a script must be SQL text")
    check = check_strategy or _spec_syntax
    check_asks(epsilon, target_rmse, max_stderr, " as defaults")
    statements = _split(text)
    current = {"epsilon": None if epsilon is None else validate_epsilon(epsilon),
               "target_rmse": None if target_rmse is None
               else check_target(target_rmse, "target_rmse"),
               "max_stderr": None if max_stderr is None
               else check_target(max_stderr, "max_stderr"),
               **{k: FLAG_DEFAULTS[k] if v is None else check_flag(v, k)
                  for k, v in zip(FLAGS, (confirm, nonnegative, integer, reuse))},
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
    asked: dict = {}             # epsilon / target set since the last query: (line, column)
    for st in statements:
        if isinstance(st.expr, exp.Set):
            _apply_set(st, current, check, asked)
            pending_set = st
        elif isinstance(st.expr, exp.Command) and str(st.expr.this).upper() == "SET":
            raise UnsupportedQueryError(
                f"this SET form is not supported; write SET dpsql.<name> = <value> "
                f"({_ALLOWED_SETS})", st.line, st.column)
        else:
            if pending_set is not None or not groups:
                groups.append((dict(current), []))
            pending_set = None
            asked = {}
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
        if all(settings[key] is None for key in ASKS):
            raise ScriptError(
                f"{label}: no epsilon given; put SET dpsql.epsilon = <value>; (or an "
                "accuracy target, SET dpsql.target_rmse = <value>;) before its queries, or "
                "give a default (--epsilon on the command line)", workload=k)
        if settings["delta"] is None:
            raise ScriptError(
                f"{label}: no delta given; put SET dpsql.delta = <value>; before its "
                "queries, or give a default (--delta on the command line)", workload=k)
        base, by = ((release, "caller") if release is not None else
                    (settings["release"], "script") if settings["release"] is not None else
                    (f"script-{digest[:12]}", "digest"))
        workloads.append(ScriptWorkload(
            k, tuple(group), settings["epsilon"], settings["delta"], settings["strategy"],
            settings["calibration"], f"{base}/{k}", by, settings["model"],
            **{key: settings[key] for key in (*TARGETS, *FLAGS)}))
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


def _apply_set(st: Statement, current: dict, check_strategy, asked: dict) -> None:
    """Apply one SET. ``asked``: which of epsilon / the accuracy targets were set since the
    last query (two different ones for the same queries are refused)."""
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
        if name in ASKS:
            other = next((k for k in asked if k != name), None)
            if other is not None:
                raise ParseError(
                    f"dpsql.{name} and dpsql.{other} (line {asked[other][0]}) are both set "
                    "for the same queries; a workload asks either by epsilon or by an "
                    "accuracy target (dpsql.target_rmse or dpsql.max_stderr), not both; "
                    "remove one", *at)
            asked[name] = (line, col)
        if name in ("epsilon", "delta", *TARGETS):
            number = _number_literal(value)
            if number is None:
                example = {"epsilon": "0.5", "delta": "1e-6"}.get(name, "50")
                raise ParseError(f"dpsql.{name} must be a number, e.g. SET dpsql.{name} = "
                                 f"{example}", *at)
            try:
                current[name] = (validate_epsilon(number, "dpsql.epsilon") if name == "epsilon"
                                 else _delta(number, "dpsql.delta") if name == "delta"
                                 else check_target(number, f"dpsql.{name}"))
            except DpsqlError as exc:
                raise ParseError(str(exc), *at) from None
            if name in ASKS:   # the workload asks by this one from now on
                current.update({k: None for k in ASKS if k != name})
        elif name in FLAGS:
            if not isinstance(value, exp.Boolean):
                example = "false" if FLAG_DEFAULTS[name] else "true"
                raise ParseError(f"dpsql.{name} must be true or false, e.g. SET dpsql.{name} "
                                 f"= {example}; got {value.sql()}", *at)
            current[name] = bool(value.this)
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
