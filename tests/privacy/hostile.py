"""The hostile analyst's entry points and the recorders the adversarial tests share.

The analyst of the threat model (docs/threat-model.md) sends any SQL, parameters and privacy
settings through the Python API, the DB-API driver, a ``dpsql run`` script or the shell,
repeats and reads every message. The tests in ``test_hostile_*.py``, ``test_file_access.py``,
``test_neighbour_oracles.py``, ``test_sensitivity_falsification.py`` and
``test_calibration_oracle.py`` drive those entry points through the helpers below (the
fixtures built on them are in ``conftest.py``). Each test says what passing means; the
recurring meanings are:

- **refused cleanly**: an error that names the problem (one line ``error: ...`` and the
  exit status ``dpsql.errors.ERROR_TABLE`` gives its class on the command line, a
  :class:`dpsql.DpsqlError` / PEP 249 error in Python), no traceback and no data value in
  the text;
- **nothing charged**: the ledger and the table list are identical before and after
  (``conftest.snapshot``);
- **never executed**: no statement the analyst wrote reaches DuckDB (a recorder sits on every
  connection dpsql opens) and the data vector is never read.

Items of the "adversarial, fault and statistical test suite" issue covered by these files:
1 (privacy parameters), 2 (budget boundary, ledger level), 3 (batch atomicity, DB-API and
shell), 7 (injection, forbidden statements, DuckDB's own refusals), 8 (error oracles), 9
(output shape), 10 (hostile values move one cell), 11 (sensitivity falsification), 12
(calibration against mpmath) and 13 (sampler goodness of fit). Faults and races are in
``test_faults.py``, the black-box audit in ``test_audit.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil

import duckdb

import dpsql
from dpsql.interfaces import cli
from dpsql.interfaces import dbapi
from dpsql.store import database as engine
from dpsql.engines import duckdb as data_engine
from dpsql.store import ledger
from dpsql.errors import ERROR_TABLE, DpsqlError

from tests.conftest import ADULT_POLICY, raw_adult_file

NAN, INF = float("nan"), float("inf")
REFUSAL_STATUSES = {row.exit_status for row in ERROR_TABLE.values()}
QUERY = "SELECT sex, COUNT(*) FROM adult WHERE age < 40 GROUP BY sex"


# =========================================================================== helpers

@dataclasses.dataclass
class Outcome:
    """What one entry point did with one request."""

    refused: bool
    message: str                  # the error text ('' on success)
    shape: tuple = ()             # per result set: (columns, keys, rowcount) on success
    status: int | None = None     # the command line's exit status (None: not a command)


def _shape(results) -> tuple:
    """Public shape of released result sets: column names, group keys, row count."""
    out = []
    for columns, rows in results:
        n_keys = len(columns) - 4   # count, stderr, ci_low, ci_high come last
        out.append((tuple(columns), tuple(tuple(r[:n_keys]) for r in rows), len(rows)))
    return tuple(out)


def via_python(target, sql, *, explain=False, **privacy) -> Outcome:
    """``target``: a database path or an open Session."""
    privacy = privacy or dict(epsilon=0.1, delta=1e-6)
    db = dpsql.connect(target) if isinstance(target, str) else target
    try:
        if explain:
            db.explain(sql, **privacy)
            return Outcome(False, "")
        r = db.answer(sql, **privacy)
    except DpsqlError as exc:
        return Outcome(True, str(exc))
    finally:
        if isinstance(target, str):
            db.close()
    return Outcome(False, "", _shape((t.columns, t.rows) for t in r.results))


def via_dbapi(target, sql, params=None) -> Outcome:
    """``target``: a database path or an open DB-API connection."""
    conn = dbapi.connect(target, epsilon=0.1, delta=1e-6) if isinstance(target, str) else target
    try:
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
        except dbapi.Error as exc:
            assert isinstance(exc.__cause__, DpsqlError), repr(exc.__cause__)
            assert cur.description is None and cur.rowcount == -1
            return Outcome(True, str(exc))
        sets = []
        while True:
            sets.append(([d[0] for d in cur.description], cur.fetchall()))
            assert cur.rowcount == len(sets[-1][1])
            if not cur.nextset():
                break
    finally:
        if isinstance(target, str):
            conn.close()
    return Outcome(False, "", _shape(sets))


def command_line(capsys, argv) -> Outcome:
    code = cli.main([str(a) for a in argv])   # argparse's refusals too: no SystemExit
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 0:
        return Outcome(False, "", status=0)
    assert code in REFUSAL_STATUSES, (code, out, err)   # a status of dpsql.errors' table
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err   # exactly one line
    return Outcome(True, lines[-1], status=code)


def via_script(capsys, tmp_path, path, text, *flags) -> Outcome:
    script = tmp_path / "attack.sql"
    script.write_text(text)
    return command_line(capsys, ["run", path, script, "--quiet", *flags])


def via_shell(capsys, path, text, *flags) -> Outcome:
    flags = flags or ("--epsilon", "0.1", "--delta", "1e-6")
    return command_line(capsys, ["shell", path, *flags, "--confirm-share", "1", "-e", text])


class _Recording:
    """A DuckDB connection that logs every SQL text it is asked to run."""

    def __init__(self, con, log):
        self._con, self._log = con, log

    def execute(self, sql, *args, **kwargs):
        self._log.append(str(sql))
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._con, name)


class Recorder:
    """Every SQL text dpsql sends to DuckDB, and how often the data vector was read: on every
    file connection dpsql opens, and on the given in-memory sessions."""

    def __init__(self, monkeypatch, *sessions):
        self.sql: list[str] = []
        self.data_reads = 0
        real_open = engine.Database._open
        real_vector = data_engine.data_vector

        def vector(*args, **kwargs):
            self.data_reads += 1
            return real_vector(*args, **kwargs)

        monkeypatch.setattr(engine.Database, "_open",
                            lambda db, owner: _Recording(real_open(db, owner), self.sql))
        monkeypatch.setattr(data_engine, "data_vector", vector)
        for session in sessions:
            monkeypatch.setattr(session.db, "_memory", _Recording(session.db._memory, self.sql))

    def executed(self, fragment: str) -> list[str]:
        return [s for s in self.sql if fragment.lower() in s.lower()]

    def charges(self) -> list[str]:
        """Statements that would charge or release: ledger writes, result tables."""
        return [s for s in self.sql if re.match(
            r"\s*(INSERT|UPDATE|DELETE)\b.*\bdpsql\.(ledger|release_tables)\b|"
            r"\s*(CREATE|DROP) TABLE\b(?!.*\bdpsql\.)", s, re.I | re.S)]


#: the Adult columns the in-memory copies keep: the declared ones and two undeclared ones
MEMORY_COLUMNS = (*ADULT_POLICY["columns"], "education", "native_country")


@functools.lru_cache(maxsize=1)
def _adult_rows():
    """The raw Adult table's MEMORY_COLUMNS as (name and type, one value list per column)."""
    con = duckdb.connect(raw_adult_file(), read_only=True)
    types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() "
                             "WHERE table_name = 'adult'").fetchall())
    names = ", ".join(MEMORY_COLUMNS)
    columns = [list(c) for c in zip(*con.execute(f"SELECT {names} FROM adult").fetchall())]
    con.close()
    return [(n, types[n]) for n in MEMORY_COLUMNS], columns


def memory_conn(setup=(), *, epsilon=1000.0, delta=0.5):
    """A DB-API connection on an in-memory database holding Adult (MEMORY_COLUMNS) after the
    owner's ``setup`` SQL, protected; ``conn.session`` is its Session (the Python API).
    In-memory sessions use the same analyst configuration and the same code path, without
    the cost of opening a file for every request."""
    conn = dbapi.connect(":memory:", epsilon=0.1, delta=1e-6)
    types, columns = _adult_rows()
    with conn.session.db.connect() as con:
        con.execute("CREATE TABLE adult (" + ", ".join(
            f"{engine.quote_ident(n)} {t}" for n, t in types) + ")")
        con.execute("INSERT INTO adult SELECT " + ", ".join(
            f"unnest(${i + 1}::{t}[])" for i, (_, t) in enumerate(types)), columns)
        for stmt in setup:
            con.execute(stmt)
    conn.session.protect("adult", dict(ADULT_POLICY, epsilon=epsilon, delta=delta))
    return conn


def build_db(path, *, setup=(), epsilon=1000.0, delta=0.5):
    """The Adult extract at ``path`` after the owner's ``setup`` SQL, protected."""
    shutil.copyfile(raw_adult_file(), path)
    con = duckdb.connect(path)
    for stmt in setup:
        con.execute(stmt)
    con.close()
    with dpsql.connect(path) as db:
        db.protect("adult", dict(ADULT_POLICY, epsilon=epsilon, delta=delta))
    return path


def state(path) -> tuple:
    """conftest.snapshot(db) for a database path, in one connection: the ledger and the
    table list that a refused request must leave untouched."""
    db = engine.Database(path)
    with db.connect() as con:
        ledger_rows = (con.execute("SELECT * FROM dpsql.ledger ORDER BY release_id").fetchall()
                       if ledger.has_schema(con) else [])
        tables = sorted(con.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables").fetchall())
    return tuple(map(tuple, ledger_rows)), tuple(tables)


def shell_submit(session, text, **settings):
    """One submission through the shell's Executor in batch mode: (failed, out, err)."""
    import io

    from dpsql.interfaces.shell.executor import Executor
    from dpsql.interfaces.shell.settings import ShellState

    shell_state = ShellState(session, interactive=False, **settings)
    shell_state.refresh()
    out, err = io.StringIO(), io.StringIO()
    ex = Executor(shell_state, out, err, lambda reason: False, stop_on_error=True)
    ex.submit(text)
    return ex.failed, out.getvalue(), err.getvalue()
