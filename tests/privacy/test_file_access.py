"""Data leaks through files (item 7 of the adversarial suite, continued): DuckDB itself
refuses file access on analyst connections, a bypassed allow-list fails closed with the
engine's text withheld, and binary script files are refused in one line. Helpers in
``hostile.py``."""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.engines import duckdb as data_engine
from dpsql.errors import EngineError

from tests.privacy.hostile import build_db, command_line
from tests.sql.statements import statements


# =========================================================================== item 7 (files)
# The statements that touch files, run directly on an analyst connection: DuckDB's own
# configuration must refuse each of them.

FILE_STATEMENTS = statements("adult_reject.sql", "refuse", "duckdb-files")


@pytest.fixture(scope="module")
def files_env(tmp_path_factory):
    """(database path, its directory) with a secret CSV and another DuckDB file beside it."""
    root = tmp_path_factory.mktemp("files")
    path = build_db(str(root / "adult.duckdb"))
    (root / "secret.csv").write_text("ssn\n123-45-6789\n")
    con = duckdb.connect(str(root / "other.duckdb"))
    con.execute("CREATE TABLE s AS SELECT 'top secret' AS v")
    con.close()
    return path, root


@pytest.mark.parametrize("stmt", FILE_STATEMENTS)
def test_duckdb_itself_refuses_file_access_on_analyst_connections(files_env, stmt):
    """With the allow-list bypassed (the statement is run directly on a connection opened the
    way dpsql opens analyst connections, engine.ANALYST_CONFIG), DuckDB refuses it. Passing:
    a duckdb.Error, no file created, the configuration unchanged."""
    path, root = files_env
    made_before = {p.name for p in root.iterdir()}
    db = dpsql.connect(path)
    with db.db.connect() as con:
        with pytest.raises(duckdb.Error):
            con.execute(stmt.format(tmp=root)).fetchall()
        assert con.execute("SELECT current_setting('enable_external_access')").fetchone() \
            == (False,)
    db.close()
    made = {p.name for p in root.iterdir()} - made_before
    assert {m for m in made if not m.endswith(".wal")} == set()


def test_in_memory_analyst_connection_is_locked_down_too():
    """Passing: the ':memory:' session's connection refuses file access the same way."""
    db = dpsql.connect(":memory:")
    with db.db.connect() as con:
        with pytest.raises(duckdb.Error):
            con.execute("SELECT * FROM read_csv('/etc/hostname')").fetchall()
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
    db.close()


def test_bypassed_allow_list_reaching_the_engine_fails_closed(tmp_path, monkeypatch):
    """Hook: the data-vector SQL is replaced by an attacker's file read, i.e. the allow-list
    and the compiler are bypassed all the way into the kernel. Passing: DuckDB refuses the
    file; the error says the engine failed and withholds DuckDB's text (which names the file
    and could hold data); the release was charged (the kernel charges before it reads) and
    nothing was released."""
    (tmp_path / "secret.csv").write_text("ssn\n123-45-6789\n")
    secret = f"{tmp_path}/secret.csv"
    path = build_db(str(tmp_path / "adult.duckdb"))
    monkeypatch.setattr(data_engine, "render", lambda *a, **k: (
        f"SELECT count(*) AS n, 0 AS set FROM read_csv('{secret}')"))
    with dpsql.connect(path) as db:
        with pytest.raises(EngineError) as info:
            db.answer("SELECT COUNT(*) FROM adult", epsilon=0.1, delta=1e-6)
        assert "secret" not in str(info.value) and "123" not in str(info.value)
        assert "withheld" in str(info.value) and info.value.__cause__ is None
        (entry,) = db.ledger()
        assert entry["status"] == "charged"


def test_shell_refuses_a_binary_script_file_in_one_line(spare_db, no_charge, capsys):
    """Passing: `dpsql shell DB -f <the database file>` says in one line that the file is not
    UTF-8 text (exit 66, an unreadable input file), without echoing any byte of it."""
    out = command_line(capsys, ["shell", spare_db, "-f", spare_db])
    assert out.refused and "UTF-8" in out.message and out.status == 66


def test_run_refuses_a_binary_script_file_in_one_line(spare_db, capsys):
    """Passing: `dpsql run DB <the database file>` exits 66 with one line saying the script is
    not UTF-8 text, no traceback, no byte of the file."""
    out = command_line(capsys, ["run", spare_db, spare_db, "--epsilon", "0.1", "--delta",
                                 "1e-6"])
    assert out.refused and "UTF-8" in out.message and out.status == 66
