"""No tracebacks: every ``dpsql`` subcommand, fed each kind of bad input, ends with one line
``error: ...`` and the exit status the error table (dpsql.errors.ERROR_TABLE) gives its class.

Issue 22 item 5 (policy files: missing, a directory, not UTF-8, a UTF-8 byte order mark (which
is accepted), invalid TOML, wrong types anywhere) and the same for script files given to
``dpsql run`` / ``explain`` / ``shell -f``; bad flag values, a missing or broken database, an
unknown table. The matrix runs in-process (``cli.main``: the same code path as the console
script, without a Python start-up per case); a few cases run as real processes too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

import dpsql
from dpsql.errors import ERROR_TABLE, LockTimeoutError, exit_statuses_text
from dpsql.interfaces import cli

from ..conftest import ROOT, make_adult_db

STATUSES = {row.exit_status for row in ERROR_TABLE.values()}
GOOD_POLICY = """[tables.adult]
epsilon = 1.0
delta = 1e-5
[tables.adult.columns]
age = { type = "integer", min = 17, max = 90 }
sex = { type = "categorical", values = ["Female", "Male"] }
"""
Q = "SELECT sex, COUNT(*) FROM adult GROUP BY sex;\n"
EPS = ("--epsilon", "0.1", "--delta", "1e-6")


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    """Every input file, built once: one protected database, unprotected copies, policies
    and scripts in each bad shape."""
    tmp = tmp_path_factory.mktemp("cli-errors")
    db = str(tmp / "adult.duckdb")
    make_adult_db(db, epsilon=100.0, delta=1e-3).close()
    raw = str(tmp / "raw.duckdb")
    make_adult_db(raw, protect=False).close()
    small = str(tmp / "small.duckdb")       # a budget of epsilon = 1: 2 exhausts it
    make_adult_db(small, epsilon=1.0, delta=1e-5).close()
    shutil.copyfile(raw, tmp / "raw_bom.duckdb")
    files = {"db": db, "raw": raw, "small": small, "raw_bom": str(tmp / "raw_bom.duckdb"), "dir": str(tmp),
             "missing": str(tmp / "no-such-file"), "demo_new": str(tmp / "no" / "dir" / "d.db")}

    def put(name, data: bytes):
        (tmp / name).write_bytes(data)
        files[name.replace(".", "_")] = str(tmp / name)

    put("notduck.duckdb", b"this is not a database\n")
    put("latin1.toml", GOOD_POLICY.replace("Female", "F\xe9male").encode("latin-1"))
    put("bom.toml", b"\xef\xbb\xbf" + GOOD_POLICY.encode())
    put("bad.toml", b"[tables.adult\nepsilon = 1\n")
    put("tables5.toml", b"tables = 5\n")
    put("eps_text.toml", GOOD_POLICY.replace("epsilon = 1.0", 'epsilon = "lots"').encode())
    put("type_list.toml", GOOD_POLICY.replace('type = "integer"', "type = [1]").encode())
    put("columns5.toml", b"[tables.adult]\nepsilon = 1\ndelta = 0\ncolumns = 5\n")
    put("values_int.toml", GOOD_POLICY.replace('["Female", "Male"]', "7").encode())
    put("rows_text.toml", GOOD_POLICY.replace("delta = 1e-5", 'delta = 1e-5\nrows = "x"').encode())
    put("metric5.toml", GOOD_POLICY.replace("delta = 1e-5", "delta = 0\nmetric = 5").encode())
    put("people.toml", GOOD_POLICY.replace("tables.adult", "tables.people").encode())
    put("latin1.sql", "SELECT COUNT(*) FROM adult WHERE sex = 'Fémale';\n".encode("latin-1"))
    put("bom.sql", b"\xef\xbb\xbf" + Q.encode())
    put("bom_meta.sql", b"\xef\xbb\xbf\\budget\n")
    put("people.sql", b"SELECT COUNT(*) FROM people;\n")
    put("good.sql", Q.encode())
    put("syntax.sql", b"SELEC COUNT(*) FROM adult;\n")
    put("sum.sql", b"SELECT SUM(sex) FROM adult;\n")
    put("join.sql", b"SELECT COUNT(*) FROM adult JOIN adult b ON adult.age = b.age;\n")
    put("column.sql", b"SELECT COUNT(*) FROM adult WHERE salary > 3;\n")
    put("set.sql", b"SET dpsql.epsilon = 'lots';\nSELECT COUNT(*) FROM adult;\n")
    put("empty.sql", b"-- nothing here\n")
    return files


# (argv, expected status); "{name}" is a file of the fixture
CASES = [
    # no subcommand, unknown subcommand / option, missing arguments
    ([], 64), (["frobnicate"], 64), (["budget"], 64), (["budget", "{db}", "--frob"], 64),
    (["ledger", "{db}", "extra"], 64), (["run", "{db}"], 64), (["protect", "{db}"], 64),
    # the database: missing, a directory, not a DuckDB file, for every subcommand
    *[(argv, status) for bad, status in (("{missing}", 66), ("{dir}", 66),
                                         ("{notduck_duckdb}", 69))
      for argv in (["budget", bad], ["ledger", bad], ["protect", bad, "{bom_toml}"],
                   ["run", bad, "{good_sql}", *EPS], ["explain", bad, "{good_sql}", *EPS],
                   ["shell", bad, "-e", "\\budget"])],
    # the demo refuses an existing file; a path in a missing directory cannot be opened
    (["demo", "--db", "{db}"], 65), (["demo", "--db", "{demo_new}"], 69),
    # policy files (issue 22 item 5)
    (["protect", "{raw}", "{missing}"], 66), (["protect", "{raw}", "{dir}"], 66),
    (["protect", "{raw}", "{latin1_toml}"], 66), (["protect", "{raw}", "{bad_toml}"], 65),
    (["protect", "{raw}", "{tables5_toml}"], 65), (["protect", "{raw}", "{eps_text_toml}"], 65),
    (["protect", "{raw}", "{type_list_toml}"], 65), (["protect", "{raw}", "{columns5_toml}"], 65),
    (["protect", "{raw}", "{values_int_toml}"], 65), (["protect", "{raw}", "{rows_text_toml}"], 65),
    (["protect", "{raw}", "{metric5_toml}"], 65), (["protect", "{raw}", "{people_toml}"], 65),
    (["protect", "{raw}", "{bom_toml}", "--table", "people"], 65),
    (["protect", "{raw_bom}", "{bom_toml}"], 0),                        # a BOM is accepted
    (["protect", "{db}", "{bom_toml}"], 65),                            # already protected
    # script files for run / explain / shell -f
    *[(argv, status) for bad, status in (("{missing}", 66), ("{dir}", 66),
                                         ("{latin1_sql}", 66), ("{people_sql}", 65))
      for argv in (["run", "{db}", bad, *EPS], ["explain", "{db}", bad, *EPS],
                   ["shell", "{db}", *EPS, "-f", bad])],
    (["explain", "{db}", "{bom_sql}", *EPS], 0), (["run", "{db}", "{bom_sql}", *EPS,
                                                   "--dry-run"], 0),
    (["shell", "{db}", "-f", "{bom_meta_sql}"], 0), (["shell", "{db}", *EPS, "-f", "{bom_sql}"], 0),
    # bad flag values
    (["run", "{db}", "{good_sql}", "--epsilon", "lots", "--delta", "1e-6"], 65),
    (["run", "{db}", "{good_sql}", "--epsilon", "-1", "--delta", "1e-6"], 65),
    (["run", "{db}", "{good_sql}", "--epsilon", "0.1", "--delta", "2"], 65),
    (["run", "{db}", "{good_sql}", *EPS, "--model", "sideways"], 65),
    (["run", "{db}", "{good_sql}", *EPS, "--calibration", "guess"], 65),
    (["run", "{db}", "{good_sql}", *EPS, "--strategy", "eigen("], 65),
    (["explain", "{db}", "{good_sql}", "--epsilon", "nan", "--delta", "1e-6"], 65),
    (["shell", "{db}", "--epsilon", "lots", "-e", Q], 65),
    (["shell", "{db}", *EPS, "--model", "sideways", "-e", Q], 65),
    (["shell", "{db}", *EPS, "--confirm-share", "abc", "-e", Q], 65),
    (["shell", "{db}", *EPS, "--no-reuse=yes", "-e", Q], 64),
    (["shell", "{db}", *EPS, "--frob", "-e", Q], 64),
    # an unknown table
    (["shell", "{db}", *EPS, "-e", "SELECT COUNT(*) FROM people;"], 65),
    # bad SQL, unsupported SQL, an undeclared column, a bad SET, no statement: each for run,
    # explain and the shell
    *[(argv, 65) for bad in ("{syntax_sql}", "{sum_sql}", "{join_sql}", "{column_sql}",
                             "{set_sql}", "{empty_sql}")
      for argv in (["run", "{db}", bad, *EPS], ["explain", "{db}", bad, *EPS])],
    *[(["shell", "{db}", *EPS, "-e", sql], 65)
      for sql in ("SELEC COUNT(*) FROM adult;", "SELECT MIN(age) FROM adult;",
                  "SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY 2;",
                  "SELECT COUNT(*) FROM adult WHERE salary > 3;")],
    # budget exhausted (77): more than the table's epsilon of 1
    (["run", "{small}", "{good_sql}", "--epsilon", "2", "--delta", "1e-6"], 77),
    (["explain", "{small}", "{good_sql}", "--epsilon", "2", "--delta", "1e-6"], 77),
    (["shell", "{small}", "--epsilon", "2", "--delta", "1e-6", "--confirm-share", "1",
      "-e", Q], 77),
    # settings of the connection, and outputs
    (["run", "{db}", "{good_sql}", *EPS, "--max-memory", "lots"], 65),
    (["explain", "{db}", "{good_sql}", *EPS, "--time-limit", "-1"], 65),
    (["run", "{db}", "{good_sql}", *EPS, "--csv", "{good_sql}"], 64),
    (["run", "{db}", "{good_sql}", *EPS, "--json", "--quiet"], 64),
    *[(argv + ["--lock-timeout", bad], 65) for bad in ("-1", "soon")
      for argv in (["budget", "{db}"], ["ledger", "{db}"], ["protect", "{raw}", "{bom_toml}"])],
    (["budget", "{db}", "--json", "--lock-timeout"], 64),
    # bad flags, for every subcommand
    (["demo", "--frob"], 64), (["protect", "{raw}", "{bom_toml}", "--frob"], 64),
    (["explain", "{db}", "{good_sql}", "--frob"], 64), (["ledger", "{db}", "--frob"], 64),
    (["run", "{db}", "{good_sql}", "--frob"], 64), (["run", "{db}", "{good_sql}", "--epsilon"], 64),
    (["--frob"], 64),
    # the server and its users file (a refusal before anything listens)
    (["serve", "{db}", "--frob"], 64), (["user", "add", "{missing}", "alice", "--frob"], 64),
    (["user", "frob", "{missing}", "alice"], 64), (["serve", "{missing}"], 66),
    (["serve", "{dir}"], 66), (["serve", "{db}", "--users", "{missing}"], 66),
]


def test_the_docs_table_is_the_error_table():
    """docs/scripts.md's exit-status table says what ERROR_TABLE says, class by class (and
    ``dpsql --help`` prints its section from the table itself)."""
    docs = (ROOT / "docs" / "scripts.md").read_text(encoding="utf-8")
    rows = {}
    for line in docs.splitlines():
        m = re.match(r"^\| (\d+) \| `(\w+)`[^|]*\| (\w{5})\b[^|]*\| `(\w+)`", line)
        if m:
            rows[m.group(2)] = (int(m.group(1)), m.group(3), m.group(4))
    assert rows == {cls.__name__: (row.exit_status, row.sqlstate, row.dbapi)
                    for cls, row in ERROR_TABLE.items()}
    helptext = cli.build_parser().format_help()
    assert exit_statuses_text() in helptext


def test_every_subcommand_has_bad_input_cases():
    """Systematic: each subcommand ``dpsql --help`` lists is fed a bad flag, a missing or
    unreadable database and (where it reads one) a bad file."""
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    commands = set(sub.choices)
    assert commands >= {"demo", "protect", "run", "explain", "shell", "budget", "ledger"}
    refused = {argv[0] for argv, status in CASES if argv and status}
    assert commands <= refused, commands - refused
    flags = {argv[0] for argv, status in CASES if status == 64 and "--frob" in argv}
    assert commands <= flags, commands - flags


def _ids(case):
    argv, status = case
    return f"{status}:" + " ".join(a.strip("{}") for a in argv)[:70]


def _refusal(capsys, argv, status):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == status, (code, out, err)
    if status == 0:
        return
    assert code in STATUSES
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err     # one line
    assert len(lines[0]) > len("error: ") + 10


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_every_bad_input_is_one_line_with_the_tables_status(f, capsys, case):
    argv, status = case
    _refusal(capsys, [a.format(**f) for a in argv], status)


def test_bad_inputs_charge_nothing_and_the_bom_policy_protected(f):
    with dpsql.connect(f["db"]) as db:   # only the --dry-run / explain / \budget cases ran
        assert all(e["epsilon"] == 0.1 for e in db.ledger())   # the BOM shell -f release
        assert len(db.ledger()) <= 1
    with dpsql.connect(f["raw_bom"]) as db:
        assert set(db.policies()) == {"adult"}
    with dpsql.connect(f["raw"]) as db:
        assert db.policies() == {}           # every refused policy wrote nothing


def test_messages_name_the_problem_and_the_fix(f, capsys):
    for argv, words in [
        (["protect", f["raw"], f["missing"]], ("does not exist", "check the path")),
        (["protect", f["raw"], f["dir"]], ("is a directory", "path of a file")),
        (["protect", f["raw"], f["latin1_toml"]], ("not UTF-8", "save it as UTF-8")),
        (["protect", f["raw"], f["bad_toml"]], ("not valid TOML", "line 1")),
        (["protect", f["raw"], f["tables5_toml"]], ("tables",)),
        (["run", f["db"], f["latin1_sql"], *EPS], ("script", "not UTF-8")),
        (["budget", f["missing"]], ("does not exist", "dpsql demo")),
        (["protect", f["db"], f["bom_toml"]], ("already protected", "--replace")),
        (["run", f["db"], f["good_sql"], "--epsilon", "lots"], ("--epsilon", "such as 0.1")),
    ]:
        cli.main(argv)
        err = capsys.readouterr().err
        assert all(w in err for w in words), (argv, err)
        assert "\\x" not in err and "Fémale" not in err   # no byte of the file is echoed


# a real lock: another process holds the database file; every subcommand that opens it
# gives up after --lock-timeout with the lock's row of the error table
LOCKED = [["budget", "{locked}"], ["ledger", "{locked}", "--json"],
          ["protect", "{locked}", "{bom_toml}"], ["run", "{locked}", "{good_sql}", *EPS],
          ["explain", "{locked}", "{good_sql}", *EPS], ["shell", "{locked}", *EPS, "-e", Q],
          ["serve", "{locked}", "--port", "0"]]


@pytest.fixture(scope="module")
def held(f, tmp_path_factory):
    """A copy of the protected database, held open by a child Python process (DuckDB's
    file lock) until the module's tests are done; then the child is killed."""
    path = str(tmp_path_factory.mktemp("locked") / "locked.duckdb")
    shutil.copyfile(f["db"], path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
         "print('holding', flush=True); sys.stdin.read()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        yield path, holder.pid
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()


def test_every_subcommand_with_a_lock_wait_has_a_locked_case():
    """The subcommands that take --lock-timeout (all that open the database; the shell
    parses its own) are exactly those the locked cases run."""
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    waiting = {name for name, p in sub.choices.items()
               if any("--lock-timeout" in a.option_strings for a in p._actions)}
    assert waiting == {"budget", "ledger", "protect", "run", "explain", "serve"}
    assert {argv[0] for argv in LOCKED} == waiting | {"shell"}


@pytest.mark.parametrize("argv", LOCKED, ids=[" ".join(a)[:40] for a in LOCKED])
def test_a_locked_database_is_one_line_naming_the_holder_and_the_fix(f, held, capsys, argv):
    path, pid = held
    code = cli.main([a.format(**f, locked=path) for a in argv] + ["--lock-timeout", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and out == "", (out, err)
    assert code == ERROR_TABLE[LockTimeoutError].exit_status == 75, (code, err)
    lines = err.strip().splitlines()
    countdown = [line for line in lines if line.startswith("database locked by ")]
    assert all(f"pid {pid} " in line and "--lock-timeout" in line for line in countdown)
    errors = [line for line in lines if line not in countdown]
    assert len(errors) == 1 and errors[0].startswith("error: database "), err   # one line
    assert f"pid {pid} " in errors[0]                                 # the holder
    assert "try again later" in errors[0] and "--lock-timeout" in errors[0]     # the fix


def test_the_real_console_command_per_subcommand(f):
    """One bad input per subcommand through ``python -m dpsql`` (processes side by side)."""
    cases = [(["demo", "--db", f["db"]], 65), (["protect", f["raw"], f["tables5_toml"]], 65),
             (["shell", f["db"], "-f", f["latin1_sql"]], 66),
             (["run", f["db"], f["dir"], *EPS], 66),
             (["explain", f["db"], f["people_sql"], *EPS], 65),
             (["budget", f["notduck_duckdb"]], 69), (["ledger", f["missing"]], 66),
             (["run", f["db"], f["good_sql"], "--epsilon", "lots"], 65), ([], 64)]
    procs = [(subprocess.Popen([sys.executable, "-m", "dpsql", *argv], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
              argv, status) for argv, status in cases]
    for p, argv, status in procs:
        out, err = p.communicate(timeout=600)
        assert "Traceback" not in out + err, (argv, err)
        assert p.returncode == status, (argv, p.returncode, err)
        # processes side by side on one file: one may print the lock-wait progress line
        # (the holder's pid, the countdown) before its one-line error
        lines = [ln for ln in err.strip().splitlines()
                 if not ln.startswith("database locked by pid")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)


def test_standard_input_scripts_not_utf8_refused_bom_accepted(f):
    """``dpsql run DB -`` and ``dpsql shell DB -f -`` read standard input like a file."""
    cases = [(["run", f["db"], "-", *EPS, "--dry-run"], b"SELECT COUNT(*) FROM adult WHERE "
              b"sex = 'F\xe9male';", 66),
             (["shell", f["db"], *EPS, "-f", "-"], b"SELECT 'F\xe9male';", 66),
             (["explain", f["db"], "-", *EPS], b"\xef\xbb\xbf" + Q.encode(), 0),
             (["shell", f["db"], "-f", "-"], b"\xef\xbb\xbf\\budget\n", 0)]
    procs = [(subprocess.Popen([sys.executable, "-m", "dpsql", *argv], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE), argv, data, status)
             for argv, data, status in cases]
    for p, argv, data, status in procs:
        out, err = p.communicate(data, timeout=600)
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        assert "Traceback" not in out + err, (argv, err)
        assert p.returncode == status, (argv, p.returncode, err)
        if status:
            assert err.startswith("error: standard input is not UTF-8") and len(
                err.splitlines()) == 1, err
