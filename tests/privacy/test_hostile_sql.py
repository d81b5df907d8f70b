"""Hostile SQL (item 7 of the adversarial suite): injection, stacked and forbidden
statements, catalog and ledger reads through every interface, with proof that none of it
reaches DuckDB; number subclasses and quoting tricks; a huge exponent literal. DuckDB's own
refusals of file access are in ``test_file_access.py``. Helpers in ``hostile.py``."""

from __future__ import annotations

import re
import shutil
from decimal import Decimal
from fractions import Fraction

import pytest

from dpsql.interfaces import dbapi
from dpsql.errors import DpsqlError

from tests.conftest import snapshot
from tests.privacy.hostile import (Recorder, shell_submit, state, via_dbapi, via_python, via_script,
                                    via_shell)
from tests.sql.statements import statements
from tests.sql.statements import where as statement_at


# =========================================================================== item 7
# The parser's allow-list is covered statement by statement in tests/sql/fixtures/reject.sql
# (test_sql_fixtures.py), parameters carrying SQL in
# test_dbapi.py::test_string_parameters_cannot_inject, three file operations on the analyst
# connection in test_release.py::test_analyst_connections_cannot_touch_files. Added: every
# attack through every interface, with proof that none of it reached DuckDB, and DuckDB's own
# refusals for the rest of the file-touching statements.

#: every attack, one entry each in tests/sql/fixtures/adult_reject.sql (group `attack`)
ATTACKS = statements("adult_reject.sql", "refuse", "attack")


FORBIDDEN_FRAGMENTS = (
    "pwned", "secret.csv", "read_", "glob(", "attach", "copy ", "pragma", "install", "load ",
    "export", "import", "information_schema", "duckdb_settings", "enable_external", "getenv",
    "drop ", "delete", "update ", "truncate", "rename", "insert", "vacuum", "checkpoint",
    "summarize", "describe", "show ", "threads")


def _never_sent(rec: Recorder) -> list:
    """Fragments of attacks found in SQL that dpsql sent to DuckDB (should be none)."""
    return [(f, rec.executed(f)) for f in FORBIDDEN_FRAGMENTS if rec.executed(f)]


def _pwned(tmp_path) -> list:
    return sorted(p.name for p in tmp_path.iterdir() if "pwned" in p.name)


@pytest.mark.parametrize("attack", ATTACKS)
def test_attacks_are_refused_before_execution_python_and_dbapi(mem, tmp_path, monkeypatch,
                                                              attack):
    """Passing: answer(), explain() and the DB-API's execute() refuse the batch with an error
    naming the construct and no data value; nothing is charged; no file appears; the data
    vector is never read; and no text of the attack (its statements, tables, files or
    functions) is ever sent to DuckDB."""
    sql = attack.format(tmp=tmp_path)
    before = snapshot(mem.session)
    rec = Recorder(monkeypatch, mem.session)
    outcomes = {"answer": via_python(mem.session, sql),
                "explain": via_python(mem.session, sql, explain=True),
                "dbapi": via_dbapi(mem, sql)}
    monkeypatch.undo()
    for where, out in outcomes.items():
        assert out.refused, f"{where} accepted {sql!r} ({statement_at('adult_reject.sql', attack)})"
        assert "32561" not in out.message and "123-45" not in out.message
    assert outcomes["answer"].message == outcomes["dbapi"].message
    assert rec.data_reads == 0 and _never_sent(rec) == []
    assert _pwned(tmp_path) == []
    assert snapshot(mem.session) == before


def test_attacks_are_refused_by_the_script_runner_and_the_shell_executor(mem, tmp_path,
                                                                         monkeypatch):
    """Every attack as a reporting script (dpsql.interfaces.scripts.run: parse, check, run) and as a shell
    submission (the shell's Executor, batch mode), on the in-memory database. Passing: each is
    refused (a DpsqlError from the script runner; one `error: ...` line and `failed` from the
    shell); nothing is charged; the data vector is never read; no text of an attack reaches
    DuckDB. (The same paths end to end through `dpsql run` / `dpsql shell -e` on a file: next
    test, for one attack of each kind.)"""
    from dpsql.interfaces import scripts

    before = snapshot(mem.session)
    rec = Recorder(monkeypatch, mem.session)
    accepted = []
    for attack in ATTACKS:
        sql = attack.format(tmp=tmp_path)
        try:
            scripts.run(mem.session, f"SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6;\n{sql};")
            accepted.append(("script", sql))
        except DpsqlError as exc:
            assert "123-45" not in str(exc)
        failed, out, err = shell_submit(mem.session, sql + ";", epsilon=Fraction(1, 10),
                                         delta=Fraction(1, 10**6))
        lines = err.strip().splitlines()
        if not (failed and len(lines) == 1 and lines[0].startswith("error: ")):
            accepted.append(("shell", sql, out, err))
    monkeypatch.undo()
    assert accepted == []
    assert rec.data_reads == 0 and _never_sent(rec) == []
    assert _pwned(tmp_path) == []
    assert snapshot(mem.session) == before


ATTACK_KINDS = [
    "SELECT COUNT(*) FROM adult /* harmless? */; DROP TABLE adult",
    "COPY adult TO '{tmp}/pwned.csv'",
    "SET enable_external_access = true;\nSELECT COUNT(*) FROM adult",
    "SELECT COUNT(*) FROM read_csv('{tmp}/secret.csv')",
    "SELECT COUNT(*) FROM adult WHERE sex IN (SELECT sql_text FROM dpsql.ledger)",
]
assert set(ATTACK_KINDS) <= set(ATTACKS)


@pytest.fixture
def attack_file(tmp_path, adult_template):
    path = str(tmp_path / "adult.duckdb")
    shutil.copyfile(adult_template, path)
    (tmp_path / "secret.csv").write_text("ssn\n123-45-6789\n")
    return path


def test_attacks_are_refused_by_dpsql_run_and_dpsql_shell(attack_file, tmp_path, capsys,
                                                          monkeypatch):
    """Five kinds of attack (a stacked DROP behind a comment, COPY TO a file, SET, a file
    reader, the ledger in a subquery) through the real commands on a database file.
    Passing: exit 65 (SQL refused) with one `error: ...` line and no traceback; nothing charged; no file
    appears; no text of an attack reaches DuckDB."""
    before = state(attack_file)
    rec = Recorder(monkeypatch)
    accepted = []
    for attack in ATTACK_KINDS:
        sql = attack.format(tmp=tmp_path)
        script = via_script(capsys, tmp_path, attack_file,
                            f"SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6;\n{sql};")
        shell = via_shell(capsys, attack_file, sql + ";")
        accepted += [(where, sql) for where, out in (("script", script), ("shell", shell))
                     if not out.refused or "123-45" in out.message]
    monkeypatch.undo()
    assert accepted == []
    assert rec.data_reads == 0 and _never_sent(rec) == []
    assert _pwned(tmp_path) == []
    assert state(attack_file) == before


class _SneakyInt(int):
    def __str__(self):
        return "1; DROP TABLE adult"

    __repr__ = __str__


class _SneakyDecimal(Decimal):
    def __str__(self):
        return "1) OR (1 = 1"

    __repr__ = __str__


class _SneakyFloat(float):
    def __repr__(self):
        return "1 OR 1 = 1"

    __str__ = __repr__


def _adult_rows_now(session) -> int:
    with session.db.connect() as con:
        return con.execute("SELECT COUNT(*) FROM adult").fetchone()[0]


@pytest.mark.parametrize("value", [_SneakyInt(30), _SneakyDecimal("30"), _SneakyFloat(30.0)],
                         ids=["int", "Decimal", "float"])
def test_number_subclasses_cannot_smuggle_sql(spend, value):
    """Passing: a number whose str/repr is SQL binds as its numeric value (30), or is refused;
    the table is intact and the statement recorded in the ledger is the plain comparison."""
    before = snapshot(spend.session)
    try:
        spend.cursor().execute("SELECT COUNT(*) FROM adult WHERE age >= ?", [value])
    except dbapi.ProgrammingError:
        assert snapshot(spend.session) == before
    else:
        assert spend.session.ledger()[-1]["sql_text"] in (
            "SELECT COUNT(*) FROM adult WHERE age >= 30",
            "SELECT COUNT(*) FROM adult WHERE age >= 30.0")
    assert _adult_rows_now(spend.session) == 32561


ODD_NAMES = [
    ('CREATE TABLE "pwn""; DROP TABLE adult; --" AS SELECT COUNT(*) FROM adult',
     'pwn"; DROP TABLE adult; --', "count"),
    ('SELECT COUNT(*) AS "n""); DROP TABLE adult; --" FROM adult', None,
     'n"); DROP TABLE adult; --'),
    ('SELECT sex AS "s\'; DROP TABLE adult; --", COUNT(*) FROM adult GROUP BY sex', None,
     "count"),
    ("SELECT COUNT(*) FROM adult /* ; DROP TABLE adult */", None, "count"),
    ("SELECT COUNT(*) FROM adult -- ; DROP TABLE adult", None, "count"),
]


@pytest.mark.parametrize("sql, table, count_column", ODD_NAMES)
def test_quoting_and_comment_tricks_that_are_accepted_stay_inert(
        spend, monkeypatch, sql, table, count_column):
    """Passing: these are legal batches. They are released; an odd table or column name is
    created verbatim as a quoted identifier (a view over the release's stored answers); the
    only DROP dpsql ever sends is of its own result table written as a base table before
    schema version 3, when a release replaces it (none here); `adult` is intact."""
    spend = spend.session
    rec = Recorder(monkeypatch, spend)
    release = spend.answer(sql, epsilon=0.1, delta=1e-6)
    monkeypatch.undo()
    assert release.results[0].columns[-4] == count_column
    if table is not None:
        assert release.tables == [table]
    drops = [s for s in rec.sql if s.lstrip().upper().startswith("DROP")]
    assert drops == [], drops
    assert _adult_rows_now(spend) == 32561
    with spend.db.connect() as con:
        names = {r[0] for r in con.execute("SELECT table_name FROM "
                                           "information_schema.tables").fetchall()}
    assert "adult" in names and (table is None or table in names)


class _GuardedFraction(Fraction):
    """Fraction that refuses to expand a decimal exponent beyond 10**10000 (which costs
    seconds to hours: Fraction('1e10000000') takes ~13 s on this machine, 1e100000000 far
    longer), so the test below fails fast instead of hanging."""

    def __new__(cls, numerator=0, denominator=None):
        if isinstance(numerator, str):
            exponent = re.search(r"[eE]\s*([+-]?\d+)\s*$", numerator)
            if exponent and abs(int(exponent.group(1))) > 10_000:
                raise AssertionError(f"Fraction({numerator!r}) would build 10**"
                                     f"{abs(int(exponent.group(1)))}")
        return super().__new__(cls, numerator, denominator)


def test_a_huge_exponent_literal_is_handled_without_expanding_it(mem, monkeypatch):
    """Passing: `age < 1e100000000` is answered or refused (it is below every declared value
    either way) without building the 100-million-digit integer."""
    from dpsql.sql import literals as literals_module

    monkeypatch.setattr(literals_module, "Fraction", _GuardedFraction)
    via_python(mem.session, "SELECT COUNT(*) FROM adult WHERE age < 1e100000000",
               explain=True)
