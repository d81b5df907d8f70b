"""Split a reporting script into workloads with their settings and release names.

Pure: no database. The rules (workloads, settings, release names) are documented in
:mod:`dpsql.interfaces.scripts` and ``docs/scripts.md``; :mod:`dpsql.interfaces.scripts` checks and runs the result.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from fractions import Fraction

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from dpsql.errors import ParseError, ScriptError, UnsupportedQueryError, WorkloadBlockError
from dpsql.sql import marker as markers
from dpsql.sql import bigquery
from dpsql.sql.script_settings import (TARGETS, _allowed, _apply_set, _with_options,  # noqa: F401
                                       check_asks)
from dpsql.sql.readback import reads as reading
from dpsql.sql.parse import split_statements

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
    marker: str | None = None    # BEGIN WORKLOAD, COMMIT, ... (dpsql.sql.marker), else None


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
        return _lines(self.statements)

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
class ScriptRead:
    """A read of result tables (free post-processing), run after ``after`` workloads."""

    number: int                  # from 1
    statement: Statement
    after: int

    @property
    def label(self) -> str:
        return f"read {self.number} ({_lines([self.statement])})"


@dataclass(frozen=True)
class Script:
    text: str
    digest: str                  # SHA-256 of the normalized script
    workloads: tuple             # ScriptWorkload
    reads: tuple = ()            # ScriptRead


def parse_script(text: str, *, declared: dict, defaults: dict | None = None,
                 release: str | None = None, tables: tuple | None = None) -> Script:
    """Split a script into workloads with their settings and release names (no database).

    ``declared``: the settings a script may set, by name (:data:`dpsql.request.declared.SETTINGS`
    exposed to ``script``): each has a ``kind`` (``number``, ``flag``, ``text``), a
    ``default``, ``ask`` (epsilon and the accuracy targets) and ``parse(text, "script")``,
    the one parser every interface shares. ``defaults``: the caller's values, already
    parsed (at most one of epsilon and the targets); the script's ``SET`` statements
    override them. ``release``: the caller's release name, which overrides every
    ``SET dpsql.release``. ``tables``: (protected, result tables) of the database: a query
    reading result tables (:func:`dpsql.sql.readback.reads`) is then a :class:`ScriptRead`."""
    if not isinstance(text, str):
        raise ParseError("a script must be SQL text")
    defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
    asks = tuple(name for name, setting in declared.items() if setting.ask)
    check_asks(*(defaults.get(k) for k in asks), " as defaults")
    split = _split(text)         # the digest counts the markers: they group the workloads
    digest = hashlib.sha256(";\n".join(s.normalized for s in split).encode()).hexdigest()
    reads = set() if tables is None else {
        id(st) for st, read in zip(split, reading([s.normalized for s in split], *tables))
        if read}
    grouping = _Grouping(declared, defaults, reads)
    for st in _blocks(split, reads):
        grouping.add(st)
    return Script(text, digest, tuple(
        _workload(k, _with_options(settings, group, declared, was_set), group, asks, declared,
                  release, digest)
        for k, (settings, group, was_set) in enumerate(grouping.finish(), 1)),
        tuple(ScriptRead(k, st, after) for k, (after, st) in enumerate(grouping.reads, 1)))


class _Grouping:
    """The statements of a script grouped into workloads, one handler per statement kind.

    Consecutive queries form one workload, with the settings in effect at its first query
    (the declared defaults, then the caller's, then every ``SET`` before it); a ``SET``
    after a query, and the start or end of a workload block, end the workload."""

    def __init__(self, declared: dict, defaults: dict, reads: set):
        self.declared = declared
        self.reading = reads         # id() of the statements that are reads
        self.reads: list[tuple[int, Statement]] = []     # (workloads before, read)
        self.current = {name: setting.default for name, setting in declared.items()} | defaults
        self.groups: list[tuple[dict, list[Statement], frozenset]] = []
        self.pending_set: Statement | None = None
        self.asked: dict = {}        # epsilon / target set since the last query: (line, column)
        self.new_group = False       # a workload block started or ended: so does the workload
        self.explicit: set = set()   # the settings a SET has given so far (OPTIONS yield to them)

    def add(self, st) -> None:
        """One statement of :func:`_blocks`' list, to the handler of its kind."""
        if st is _BREAK:
            self.marker()
        elif isinstance(st.expr, exp.Set):
            self.setting(st)
        elif isinstance(st.expr, exp.Command) and str(st.expr.this).upper() == "SET":
            raise UnsupportedQueryError(
                f"this SET form is not supported; write SET dpsql.<name> = <value> "
                f"({_allowed(self.declared)})", st.line, st.column)
        elif id(st) in self.reading:      # a read of result tables ends the workload
            self.reads.append((len(self.groups), st))
            self.new_group = True
        else:
            self.query(st)

    def marker(self) -> None:
        """The workload marker: a block started or ended, and so does the workload."""
        self.new_group = True

    def setting(self, st: Statement) -> None:
        """``SET dpsql.<name> = <value>``: the settings of the queries after it."""
        self.explicit |= _apply_set(st, self.current, self.declared, self.asked)
        self.pending_set = st

    def query(self, st: Statement) -> None:
        """A counting statement or a ``CREATE TABLE ... AS`` (alike here: the result table's
        name is checked before spending, :mod:`dpsql.interfaces.scripts_check`): it joins
        the current workload, or starts one after a ``SET`` or a block's start or end."""
        if self.pending_set is not None or not self.groups or self.new_group:
            self.groups.append((dict(self.current), [], frozenset(self.explicit)))
        self.pending_set, self.new_group = None, False
        self.asked = {}
        self.groups[-1][1].append(st)

    def finish(self) -> list[tuple[dict, list[Statement], frozenset]]:
        """The groups (settings, queries, the names a SET gave); refuses a trailing SET and a
        script of no query (a script of reads only has none, and that is fine)."""
        if self.pending_set is not None:
            raise UnsupportedQueryError(
                "this SET is followed by no query, so it would have no effect; settings apply "
                "to the queries after them", self.pending_set.line, self.pending_set.column)
        if not self.groups and not self.reads:
            raise ParseError("the script has no query (only settings and comments)")
        return self.groups


def _workload(k: int, settings: dict, group: list[Statement], asks: tuple, declared: dict,
              release: str | None, digest: str) -> ScriptWorkload:
    """Workload ``k`` (from 1): its settings, which must ask by epsilon or an accuracy
    target and give a delta, and its release name ``<release>/<k>`` (the caller's release,
    else ``SET dpsql.release``, else ``script-`` and the script's digest)."""
    label = f"workload {k} ({_lines(group)})"
    if all(settings[key] is None for key in asks):
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
    return ScriptWorkload(
        k, tuple(group), settings["epsilon"], settings["delta"], settings["strategy"],
        settings["calibration"], f"{base}/{k}", by, settings["model"],
        **{key: settings[key] for key, setting in declared.items()
           if key in TARGETS or setting.kind == "flag"})


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
                             bigquery.with_clause(expr.sql(dialect="duckdb", comments=False),
                                                  text[start:end]),
                             markers.marker_of([t.text for t in toks]) if len(toks) <= 2
                             else None))
    return out


_BREAK = object()     # where a workload block starts or ends, in what _blocks returns


def _blocks(statements: list[Statement], reads: set) -> list:
    """The statements with the workload markers applied (:mod:`dpsql.sql.marker`): each
    ``BEGIN WORKLOAD`` and ``COMMIT`` of a block becomes a break between workloads, a
    rolled-back block's statements are dropped, plain ``BEGIN`` / ``COMMIT`` / ``ROLLBACK``
    are no-ops. Nested, unclosed blocks, a SET and a read of result tables inside a block
    are refused."""
    out: list = []
    block, start, opened = markers.WorkloadBlock(), 0, None
    for st in statements:
        if st.marker is None:
            if block.is_open and isinstance(st.expr, (exp.Set, exp.Command)):
                raise WorkloadBlockError(
                    f"a SET inside a workload block (opened at line {opened.line}); put "
                    "settings before BEGIN WORKLOAD: a block is one workload with one "
                    "set of settings", st.line, st.column)
            if block.is_open and id(st) in reads:
                raise WorkloadBlockError(
                    f"a read of result tables inside a workload block (opened at line "
                    f"{opened.line}); read them after COMMIT", st.line, st.column)
            out.append(st)
        elif st.marker == markers.BEGIN_WORKLOAD:
            block.begin(st.line, st.column)
            start, opened = len(out), st
            out.append(_BREAK)
        elif block.is_open and st.marker in (markers.COMMIT, markers.ROLLBACK):
            block.close()
            if st.marker == markers.ROLLBACK:
                del out[start:]
            out.append(_BREAK)
    if block.is_open:
        raise WorkloadBlockError(
            f"BEGIN WORKLOAD at line {opened.line} is never committed; end the block with "
            "COMMIT; (or ROLLBACK; to discard it)", opened.line, opened.column)
    return out


def _lines(group: list[Statement]) -> str:
    a, b = group[0].line, group[-1].end_line
    return f"line {a}" if a == b else f"lines {a}-{b}"


