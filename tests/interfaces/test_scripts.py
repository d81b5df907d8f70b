"""Reporting scripts: settings, workloads, release names, checks before spending, the CLI."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql.interfaces import cli
from dpsql.interfaces import scripts
from dpsql.errors import DpsqlError, ParseError
from dpsql.session import Session

from ..conftest import ADULT_POLICY, ROOT, make_adult_db, snapshot

METRIC = {"epsilon": 2, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
AGE_RANGES = ("SELECT COUNT(*) AS young FROM adult WHERE age BETWEEN 17 AND 29;\n"
              "SELECT COUNT(*) AS middle FROM adult WHERE age BETWEEN 30 AND 49;\n"
              "SELECT COUNT(*) AS older FROM adult WHERE age >= 50;\n")

TWO_WORKLOADS = """-- weekly report
SET dpsql.release = 'weekly';
SET dpsql.epsilon = 0.2;
SET dpsql.delta = 1e-6;
CREATE TABLE by_sex AS SELECT sex, COUNT(*) AS people FROM adult GROUP BY sex;
SELECT COUNT(*) AS young FROM adult WHERE age < 30;   -- same workload
SET dpsql.epsilon = 0.3;                               -- ends workload 1
SET dpsql.strategy = 'identity';
CREATE TABLE seniors AS SELECT COUNT(*) AS people FROM adult WHERE age >= 65;
"""


@pytest.fixture
def db_path(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


@pytest.fixture
def metric_db_path(tmp_path):
    """Adult protected by ADULT_POLICY plus a metric (d_X) model with its own budget."""
    path = str(tmp_path / "metric.duckdb")
    db = make_adult_db(path, protect=False)
    db.protect("adult", dict(ADULT_POLICY, metric=METRIC))
    db.close()
    return path


def run_cli(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, text, name="report.sql"):
    path = tmp_path / name
    path.write_text(text)
    return path


def tables(path) -> set:
    con = duckdb.connect(path, read_only=True)
    try:
        return {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    finally:
        con.close()


# --------------------------------------------------------------------------- parsing


def test_settings_and_workloads():
    s = scripts.parse_script(TWO_WORKLOADS)
    w1, w2 = s.workloads
    assert (w1.number, w1.epsilon, w1.delta, w1.strategy, w1.calibration) == \
        (1, Fraction(1, 5), Fraction(1, 10**6), "auto", "analytic")
    assert (w2.epsilon, w2.delta, w2.strategy) == (Fraction(3, 10), Fraction(1, 10**6),
                                                   "identity")  # delta carried over
    assert (w1.name, w2.name) == ("weekly/1", "weekly/2")
    assert (w1.lines, w2.lines) == ("lines 5-6", "line 9")
    assert len(w1.sql) == 2 and w1.sql[1] == "SELECT COUNT(*) AS young FROM adult WHERE age < 30"


def test_every_setting_parses_with_sqlglot_and_to_works():
    s = scripts.parse_script(
        "SET dpsql.epsilon TO 1e-1; SET \"dpsql\".\"DELTA\" = 0.000001;\n"
        "SET dpsql.strategy = 'workload'; SET dpsql.calibration = 'classic';\n"
        "SET dpsql.release = 'r-2026-47'; SELECT COUNT(*) FROM adult")
    (w,) = s.workloads
    assert (w.epsilon, w.delta, w.strategy, w.calibration, w.name) == \
        (Fraction(1, 10), Fraction(1, 10**6), "workload", "classic", "r-2026-47/1")


def test_caller_defaults_are_overridden_by_set_and_release_overrides_set():
    text = "SELECT COUNT(*) FROM adult;\nSET dpsql.epsilon = 0.3;\nSELECT COUNT(*) FROM adult"
    s = scripts.parse_script(text, epsilon=0.1, delta=1e-6, strategy="identity")
    assert [w.epsilon for w in s.workloads] == [Fraction(1, 10), Fraction(3, 10)]
    assert {w.strategy for w in s.workloads} == {"identity"}
    assert s.workloads[0].name.startswith("script-")
    s = scripts.parse_script("SET dpsql.release = 'a';" + text, epsilon=0.1, delta=1e-6,
                             release="b")
    assert [w.name for w in s.workloads] == ["b/1", "b/2"]


BAD_SETS = [
    ("SET threads = 4;\nSELECT COUNT(*) FROM adult", "SET threads is not a dpsql setting", 1, 5),
    ("SELECT COUNT(*) FROM adult;\nSET dpsql.foo = 1;\nSELECT COUNT(*) FROM adult",
     "SET dpsql.foo is not a dpsql setting", 2, 5),
    ("SET dpsql.epsilon = 'high';\nSELECT COUNT(*) FROM adult", "must be a number", 1, 21),
    ("\n  SET dpsql.epsilon = -1;\nSELECT COUNT(*) FROM adult", "must be > 0", 2, 24),
    ("SET dpsql.epsilon = 0.1 + 0.2;\nSELECT COUNT(*) FROM adult", "must be a number", None,
     None),
    ("SET dpsql.delta = 1.5;\nSELECT COUNT(*) FROM adult", "0 <= dpsql.delta < 1", 1, 19),
    ("SET dpsql.strategy = 'fancy';\nSELECT COUNT(*) FROM adult", "unknown strategy", 1, 22),
    ("SET dpsql.strategy = 'eigen(bogus=1)';\nSELECT COUNT(*) FROM adult",
     "unknown option 'bogus' for strategy 'eigen'", 1, 22),
    ("SET dpsql.strategy = 'eigen(principal_vectors=0)';\nSELECT COUNT(*) FROM adult",
     "must be an integer from 1 to", 1, 22),
    ("SET dpsql.strategy = 'mwem(rounds=10, colour=1)';\nSELECT COUNT(*) FROM adult",
     "mwem has no option 'colour'", 1, 22),
    ("SET dpsql.strategy = 'eigen(principal_vectors=8';\nSELECT COUNT(*) FROM adult",
     "expected ',' or ')'", 1, 22),
    ("SET dpsql.model = 'fancy';\nSELECT COUNT(*) FROM adult", "model must be 'dp'", 1, 19),
    ("SET dpsql.model = metric;\nSELECT COUNT(*) FROM adult", "string literal", 1, None),
    ("SET dpsql.strategy = identity;\nSELECT COUNT(*) FROM adult", "string literal", 1, None),
    ("SET dpsql.calibration = 'fast';\nSELECT COUNT(*) FROM adult", "calibration", 1, 25),
    ("SET dpsql.release = '';\nSELECT COUNT(*) FROM adult", "release name", 1, 21),
    ("SET GLOBAL dpsql.epsilon = 1;\nSELECT COUNT(*) FROM adult", "SET GLOBAL", 1, 1),
    ("SELECT COUNT(*) FROM adult;\n\nSET dpsql.epsilon;", "SET form is not supported", 3, 1),
    ("SELECT COUNT(*) FROM adult;\n  SET dpsql.epsilon = 0.1;", "followed by no query", 2, 3),
    ("SELECT COUNT(*) FROM adult;\nSELEC COUNT(*) FROM adult", "could not parse", 2, None),
    ("SET dpsql.target_rmse = 'fifty';\nSELECT COUNT(*) FROM adult",
     "dpsql.target_rmse must be a number such as 50, got 'fifty'", 1, 25),
    ("SET dpsql.target_rmse = 0;\nSELECT COUNT(*) FROM adult",
     "dpsql.target_rmse must be a positive number", 1, 25),
    ("SET dpsql.max_stderr = -3;\nSELECT COUNT(*) FROM adult",
     "dpsql.max_stderr must be a positive number (an expected error, in counts), got -3", 1,
     None),
    ("SET dpsql.confirm = yes;\nSELECT COUNT(*) FROM adult",
     "dpsql.confirm must be true or false, got 'yes'", 1, None),
    ("SET dpsql.nonnegative = 'true';\nSELECT COUNT(*) FROM adult",
     "dpsql.nonnegative must be true or false, got 'true'", 1, None),
    ("SET dpsql.reuse = 'no';\nSELECT COUNT(*) FROM adult",
     "dpsql.reuse must be true or false, got 'no'", 1, None),
    ("SET dpsql.epsilon = 0.2;\nSET dpsql.target_rmse = 50;\nSELECT COUNT(*) FROM adult",
     "dpsql.target_rmse and dpsql.epsilon (line 1) are both set for the same queries", 2, 25),
    ("SET dpsql.max_stderr = 5; SET dpsql.epsilon = 0.2;\nSELECT COUNT(*) FROM adult",
     "dpsql.epsilon and dpsql.max_stderr (line 1) are both set", 1, None),
]


@pytest.mark.parametrize("text, message, line, column", BAD_SETS)
def test_bad_settings_are_refused_with_their_position(text, message, line, column):
    with pytest.raises(ParseError) as info:
        scripts.parse_script(text, epsilon=0.1, delta=1e-6)
    assert message in str(info.value)
    if line is not None:
        assert info.value.line == line and f"line {line}" in str(info.value)
    if column is not None:
        assert info.value.column == column


def test_pure_dp_strategy_specs_and_model_parse():
    s = scripts.parse_script(
        "SET dpsql.epsilon = 0.5; SET dpsql.delta = 0;\n"
        "SELECT COUNT(*) FROM adult;\n"                                      # 1: pure DP
        "SET dpsql.strategy = 'mwem(rounds=20, cuboids=true)';\n"
        "SELECT COUNT(*) FROM adult;\n"                                      # 2: mwem
        "SET dpsql.delta = 1e-6; SET dpsql.strategy = 'Eigen( principal_vectors = 8 )';\n"
        "SELECT COUNT(*) FROM adult;\n"                                      # 3: options
        "SET dpsql.strategy = 'eigen(separation=false)';\n"
        "SELECT COUNT(*) FROM adult;\n"                                      # 4: defaults
        "SET dpsql.strategy = 'auto'; SET dpsql.delta = 0; SET dpsql.model = 'metric';\n"
        "SELECT COUNT(*) FROM adult WHERE age < 30")                         # 5: metric
    assert [(w.delta, w.strategy, w.model) for w in s.workloads] == [
        (0, "auto", "dp"), (0, "mwem(rounds=20, cuboids=true)", "dp"),
        (Fraction(1, 10**6), "eigen(principal_vectors=8)", "dp"),   # as the ledger records it
        (Fraction(1, 10**6), "eigen", "dp"), (0, "auto", "metric")]
    assert s.workloads[4].params()["model"] == "metric"
    # command-line defaults: delta 0, a spec and the model, overridden by SET
    s = scripts.parse_script("SELECT COUNT(*) FROM adult;\nSET dpsql.model = 'dp';\n"
                             "SELECT COUNT(*) FROM adult", epsilon=0.5, delta=0,
                             strategy="hierarchical", model="metric")
    assert [(w.delta, w.strategy, w.model) for w in s.workloads] == [
        (0, "hierarchical", "metric"), (0, "hierarchical", "dp")]
    for bad, message in [(dict(strategy="eigen(bogus=1)"), "unknown option 'bogus'"),
                         (dict(model="dx"), "model must be 'dp'")]:
        with pytest.raises(DpsqlError, match=message):
            scripts.parse_script("SELECT COUNT(*) FROM adult", epsilon=1, delta=0, **bad)


def test_missing_epsilon_or_delta_and_empty_scripts():
    carried = scripts.parse_script("SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6;\n"
                                   "SELECT COUNT(*) FROM adult;\nSET dpsql.release = 'x';\n"
                                   "SELECT COUNT(*) FROM adult")
    assert [w.epsilon for w in carried.workloads] == [Fraction(1, 10)] * 2
    with pytest.raises(DpsqlError, match=r"workload 1 \(line 2\): no epsilon given.*--epsilon"):
        scripts.parse_script("SET dpsql.delta = 1e-6;\nSELECT COUNT(*) FROM adult")
    with pytest.raises(DpsqlError, match="no delta given"):
        scripts.parse_script("SELECT COUNT(*) FROM adult", epsilon=0.1)
    with pytest.raises(ParseError, match="no SQL statement"):
        scripts.parse_script("-- only a comment\n;;", epsilon=1, delta=1e-6)
    with pytest.raises(ParseError, match="followed by no query"):
        scripts.parse_script("SET dpsql.epsilon = 1;", delta=1e-6)


def test_comments_anywhere_and_semicolons_in_strings():
    s = scripts.parse_script(
        "/* head */ SET dpsql.epsilon /* eq */ = 0.1; -- x\n"
        "SELECT COUNT(*) -- inside\n FROM adult WHERE sex = 'a;b';;\n-- trailing",
        delta=1e-6)
    (w,) = s.workloads
    assert w.sql == ["SELECT COUNT(*) FROM adult WHERE sex = 'a;b'"]


def test_implicit_names_ignore_layout_but_not_edits():
    a = scripts.parse_script("SELECT COUNT(*) FROM adult WHERE age < 30", epsilon=1, delta=1e-6)
    b = scripts.parse_script("-- a comment\nselect   count(*)\nfrom adult where age<30;",
                             epsilon=1, delta=1e-6)
    c = scripts.parse_script("SELECT COUNT(*) FROM adult WHERE age < 31", epsilon=1, delta=1e-6)
    assert a.workloads[0].name == b.workloads[0].name == f"script-{a.digest[:12]}/1"
    assert c.workloads[0].name != a.workloads[0].name


# --------------------------------------------------------------------------- running


def test_each_workload_is_one_release_with_its_own_settings(db_path, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS))
    assert code == 0 and err == ""
    assert "workload 1/2 (lines 5-6) 'weekly/1': released as release 1" in out
    assert "workload 2/2 (line 9) 'weekly/2': released as release 2" in out
    with dpsql.connect(db_path) as db:
        rows = db.ledger()
        assert [(r["release_name"], r["epsilon"], r["n_queries"]) for r in rows] == \
            [("weekly/1", 0.2, 3), ("weekly/2", 0.3, 1)]
        # delta 1e-6 asked; auto may choose Laplace noise, which spends none
        assert all(r["delta"] == (1e-6 if r["mechanism"] == "gaussian" else 0) for r in rows)
        assert rows[1]["strategy"] == "identity" and rows[1]["delta"] == 1e-6
        assert db.budget("adult")["epsilon_spent"] == Fraction(1, 2)
    assert {"by_sex", "seniors", "dp_r1_q2"} <= tables(db_path)


def test_rerun_returns_recorded_answers_and_charges_nothing(db_path, tmp_path, capsys):
    script = write(tmp_path, TWO_WORKLOADS)
    assert run_cli(capsys, "run", db_path, script, "--csv")[0] == 0
    with dpsql.connect(db_path) as db:
        before = snapshot(db)
    code, out, err = run_cli(capsys, "run", db_path, script)
    assert code == 0 and err == ""
    assert out.count("already released as release") == 2 and "nothing charged" in out
    code, csv_again, _ = run_cli(capsys, "run", db_path, script, "--csv")
    code2, quiet, _ = run_cli(capsys, "run", db_path, script, "--quiet")
    assert quiet.splitlines() == [
        "workload 1/2 'weekly/1': already released as release 1, nothing charged; "
        "tables: by_sex, dp_r1_q2",
        "workload 2/2 'weekly/2': already released as release 2, nothing charged; "
        "tables: seniors"]
    assert csv_again and code == 0 and code2 == 0
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before


def test_used_release_name_with_edited_sql_is_refused(db_path, tmp_path, capsys):
    assert run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS))[0] == 0
    edited = TWO_WORKLOADS.replace("age >= 65", "age >= 70")
    with dpsql.connect(db_path) as db:
        before = snapshot(db)
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, edited, "edited.sql"))
    assert code == 65 and out == ""
    assert err.startswith("error: workload 2 (line 9): release name 'weekly/2' already used "
                          "for a different batch")
    assert "nothing was charged" in err and "SET dpsql.release" in err
    assert len(err.strip().splitlines()) == 1
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before
    # a new edition under a new name is charged (workload 1 too: it is a new release)
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, edited, "edited.sql"),
                             "--release", "weekly-v2", "--replace", "--quiet")
    assert code == 0 and err == "" and "'weekly-v2/2': released as release 4" in out


def test_implicit_name_rerun_and_changed_defaults(db_path, tmp_path, capsys):
    path = write(tmp_path, "SELECT COUNT(*) FROM adult WHERE age < 30")
    assert run_cli(capsys, "run", db_path, path, "--epsilon", 0.1, "--delta", 1e-6)[0] == 0
    write(tmp_path, "-- reformatted\nselect count(*)\n  from adult where age < 30;")
    code, out, _ = run_cli(capsys, "run", db_path, path, "--epsilon", 0.1, "--delta", 1e-6)
    assert code == 0 and "already released as release 1, nothing charged" in out
    code, out, err = run_cli(capsys, "run", db_path, path, "--epsilon", 0.2, "--delta", 1e-6)
    assert code == 65 and "already used for a different batch" in err and "--release" in err
    with dpsql.connect(db_path) as db:
        assert len(db.ledger()) == 1


def test_error_in_workload_two_is_found_before_anything_is_spent(db_path, tmp_path, capsys):
    bad = TWO_WORKLOADS.replace("WHERE age >= 65", "WHERE hours_per_week > 30")
    with dpsql.connect(db_path) as db:
        before = snapshot(db)
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, bad))
    assert code == 65 and out == ""
    assert err.startswith("error: workload 2 (line 9): condition on column 'hours_per_week'")
    assert "(line 9, column 68)" in err  # the position in the script, not in the workload
    # over budget in total (each workload alone would fit): refused, nothing spent
    greedy = TWO_WORKLOADS.replace("0.3", "0.9")
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, greedy))
    assert code == 77 and err.startswith("error: budget exceeded on table 'adult'")
    assert "workloads 1, 2" in err
    # a result table name used by two workloads
    twice = TWO_WORKLOADS.replace("TABLE seniors", "TABLE by_sex")
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, twice))
    assert code == 65 and "also created by workload 1" in err
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before


def test_failure_in_workload_two_keeps_workload_one(db_path, tmp_path, capsys, monkeypatch):
    """Another process spends the budget between the workloads: workload 2 is refused whole,
    workload 1 stays released and recorded, and the message says so."""
    real = Session.answer
    calls = []

    def answer(self, sql, **kw):
        calls.append(kw.get("name"))
        if len(calls) == 2:
            with dpsql.connect(db_path) as other:
                other.answer("SELECT COUNT(*) FROM adult", epsilon=0.6, delta=1e-6)
        return real(self, sql, **kw)

    monkeypatch.setattr(Session, "answer", answer)
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS))
    assert code == 77   # another process spent the budget: the budget's status
    assert "'weekly/1': released as release 1" in out  # printed as it was released
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in err
    assert line.startswith("error: workload 2 (line 9) failed: budget exceeded")
    assert "released before it and still recorded: workload 1 as 'weekly/1' (release 1)" in line
    with dpsql.connect(db_path) as db:
        assert [r["release_name"] for r in db.ledger()] == ["weekly/1", None]
    assert "seniors" not in tables(db_path) and "by_sex" in tables(db_path)
    # fixed budget? running again reuses workload 1 and refuses workload 2 before spending
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS))
    assert code == 77 and err.startswith("error: budget exceeded")


def test_ctrl_c_exits_130_and_names_what_was_released(db_path, tmp_path, capsys, monkeypatch):
    real = Session.answer
    calls = []

    def answer(self, sql, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, sql, **kw)

    monkeypatch.setattr(Session, "answer", answer)
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS), "--quiet")
    assert code == 130
    assert err.startswith("cancelled: interrupted; released before it and still recorded: "
                          "workload 1 as 'weekly/1'") and "not run: workload 2" in err


def test_dry_run_and_explain_spend_nothing(db_path, tmp_path, capsys, monkeypatch):
    from dpsql.engines import duckdb as engine

    def boom(*a, **k):
        raise AssertionError("a dry run must not read data")

    monkeypatch.setattr(engine, "data_vector", boom)
    with dpsql.connect(db_path) as db:
        before = snapshot(db)
    path = write(tmp_path, TWO_WORKLOADS)
    code, out, err = run_cli(capsys, "run", db_path, path, "--dry-run")
    assert code == 0 and err == ""
    assert "workload 1/2 (lines 5-6) 'weekly/1': would charge epsilon=0.2" in out
    assert "expected RMSE" in out and "a run would charge adult epsilon=0.5" in out
    code, out2, _ = run_cli(capsys, "explain", db_path, path)

    def without_timings(text):  # selection seconds vary; the second run hits the cache
        text = re.sub(r"( \(cached\))?( gap \S+)?$", "", text, flags=re.M)
        return re.sub(r"\s\d+\.\d\d(?=( <- chosen)?$)", " T", text, flags=re.M)

    assert code == 0 and without_timings(out2) == without_timings(out)
    code, out, _ = run_cli(capsys, "explain", db_path, path, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["release"], r["status"], r["epsilon"]) for r in rows] == \
        [("weekly/1", "new", "0.2"), ("weekly/2", "new", "0.3")]
    code, out, _ = run_cli(capsys, "run", db_path, path, "--dry-run", "--quiet")
    assert len(out.splitlines()) == 2
    with dpsql.connect(db_path) as db:
        assert snapshot(db) == before


def test_dry_run_over_budget_shows_the_plan_and_exits_2(db_path, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS), "--dry-run",
                             "--epsilon", 5)
    assert code == 0  # the script's own SETs win over the command-line default
    code, out, err = run_cli(capsys, "explain", db_path,
                             write(tmp_path, "SELECT COUNT(*) FROM adult"), "--epsilon", 5,
                             "--delta", 1e-6)
    assert code == 77 and "expected RMSE" in out and err.startswith("error: budget exceeded")


def test_csv_output_matches_the_result_tables(db_path, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS), "--csv")
    assert code == 0 and err == ""
    blocks = [list(csv.reader(io.StringIO(b))) for b in out.strip().split("\n\n")]
    assert [b[0][:2] for b in blocks] == [["release", "table"]] * 3
    by_sex = blocks[0]
    assert by_sex[0] == ["release", "table", "sex", "people", "stderr", "ci_low", "ci_high"]
    con = duckdb.connect(db_path, read_only=True)
    expected = con.execute("SELECT sex, people FROM by_sex ORDER BY sex").fetchall()
    con.close()
    assert [(r[2], float(r[3])) for r in by_sex[1:]] == expected
    assert {b[1][1] for b in blocks} == {"by_sex", "dp_r1_q2", "seniors"}


def test_existing_result_table_is_refused_before_spending(db_path, tmp_path, capsys):
    assert run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS))[0] == 0
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, TWO_WORKLOADS),
                             "--release", "weekly-v2")
    assert code == 65 and "table 'by_sex' (line 5) already exists" in err
    with dpsql.connect(db_path) as db:
        assert len(db.ledger()) == 2


def test_recorded_answers_are_not_returned_from_a_replaced_table(db_path, tmp_path, capsys):
    text = ("SET dpsql.epsilon = 0.1; SET dpsql.delta = 1e-6;\n"
            "CREATE OR REPLACE TABLE t AS SELECT COUNT(*) FROM adult;")
    path = write(tmp_path, text)
    assert run_cli(capsys, "run", db_path, path, "--release", "a")[0] == 0
    assert run_cli(capsys, "run", db_path, path, "--release", "b")[0] == 0
    code, out, err = run_cli(capsys, "run", db_path, path, "--release", "a")
    assert code == 65 and "now holds the answers of release 2" in err


PURE_AND_MWEM = """SET dpsql.release = 'pure';
SET dpsql.epsilon = 0.25;
SET dpsql.delta = 0;
SELECT sex, COUNT(*) AS people FROM adult GROUP BY sex;
SET dpsql.strategy = 'mwem(rounds=5)';
SELECT COUNT(*) AS young FROM adult WHERE age < 30;
SELECT race, COUNT(*) FROM adult GROUP BY race;
"""


def test_pure_dp_and_mwem_workloads(db_path, tmp_path, capsys):
    path = write(tmp_path, PURE_AND_MWEM)
    code, out, err = run_cli(capsys, "run", db_path, path, "--dry-run", "--quiet")
    assert code == 0 and err == ""
    assert out.splitlines()[1].endswith("strategy mwem(rounds=5), expected RMSE n/a")
    code, out, err = run_cli(capsys, "explain", db_path, path, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["delta"], r["strategy"], r["sigma"], r["expected_rmse"], r["model"])
            for r in rows][1] == ("0.0", "mwem(rounds=5)", "", "", "dp")
    assert float(rows[0]["expected_rmse"]) > 0
    code, out, err = run_cli(capsys, "run", db_path, path)
    assert code == 0 and err == ""
    assert "epsilon=0.25 delta=0 strategy=mwem(rounds=5) expected RMSE=n/a" in out
    assert "nan" not in out and "NULL" in out    # no standard error: data-dependent
    with dpsql.connect(db_path) as db:
        rows = db.ledger()
        assert [(r["release_name"], r["delta"], r["mechanism"]) for r in rows] == [
            ("pure/1", 0.0, "laplace"), ("pure/2", 0.0, "mwem")]
        assert db.budget("adult")["epsilon_spent"] == Fraction(1, 2)
        assert db.budget("adult")["delta_spent"] == 0


def test_pure_dp_and_mwem_csv(db_path, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, PURE_AND_MWEM), "--csv")
    assert code == 0 and err == ""
    blocks = [list(csv.reader(io.StringIO(b))) for b in out.strip().split("\n\n")]
    assert len(blocks) == 3
    young = blocks[1]
    assert young[0] == ["release", "table", "young", "stderr", "ci_low", "ci_high"]
    assert young[1][3:] == ["", "", ""]          # NULL: MWEM has no standard error
    float(young[1][2])
    assert all(float(r[3]) > 0 for r in blocks[0][1:])   # Laplace: exact standard errors


def test_pure_dp_mwem_and_metric_reruns_are_free(metric_db_path, tmp_path, capsys):
    metric = ("SET dpsql.release = 'ages'; SET dpsql.model = 'metric';\n"
              "SET dpsql.epsilon = 0.5; SET dpsql.delta = 0;\n" + AGE_RANGES)
    for k, text in enumerate([PURE_AND_MWEM, metric]):
        path = write(tmp_path, text, f"{k}.sql")
        assert run_cli(capsys, "run", metric_db_path, path, "--quiet")[0] == 0
        with dpsql.connect(metric_db_path) as db:
            before = snapshot(db)
        code, out, err = run_cli(capsys, "run", metric_db_path, path, "--quiet")
        assert (code, err) == (0, "") and "nothing charged" in out
        with dpsql.connect(metric_db_path) as db:
            assert snapshot(db) == before


def test_metric_model_workloads(metric_db_path, tmp_path, capsys):
    text = ("SET dpsql.release = 'ages'; SET dpsql.model = 'metric';\n"
            "SET dpsql.epsilon = 0.5; SET dpsql.delta = 0;\n" + AGE_RANGES)
    path = write(tmp_path, text)
    code, out, err = run_cli(capsys, "run", metric_db_path, path, "--dry-run")
    assert code == 0 and err == ""
    assert "would charge metric epsilon=0.5 (per unit distance)" in out
    assert "a run would charge adult metric epsilon=0.5 (per unit distance) of the " \
           "remaining metric epsilon=2" in out
    code, out, err = run_cli(capsys, "run", metric_db_path, path, "--quiet")
    assert code == 0 and err == ""
    assert out.strip().endswith("(metric epsilon=0.5 (per unit distance), strategy "
                                "dx_laplace); tables: dp_r1_q1, dp_r1_q2, dp_r1_q3")
    with dpsql.connect(metric_db_path) as db:
        (entry,) = db.ledger()
        assert (entry["mechanism"], entry["metric_epsilon"], entry["epsilon"],
                entry["delta"]) == ("dx_laplace", 0.5, 0.0, 0.0)
        budget = db.budget("adult")
        assert budget["metric_epsilon_spent"] == Fraction(1, 2)
        assert budget["epsilon_spent"] == 0          # the standard budget is untouched
    code, out, err = run_cli(capsys, "budget", metric_db_path)
    assert code == 0 and "metric_eps_left" in out and "1.5" in out
    code, out, err = run_cli(capsys, "ledger", metric_db_path)
    assert code == 0 and "metric_epsilon" in out and "dx_laplace" in out
    # both workloads of a script must fit the metric budget: refused before spending
    greedy = ("SET dpsql.model = 'metric'; SET dpsql.epsilon = 1; SET dpsql.delta = 0;\n"
              + AGE_RANGES + "SET dpsql.epsilon = 0.75;\n" + AGE_RANGES)
    with dpsql.connect(metric_db_path) as db:
        before = snapshot(db)
    code, out, err = run_cli(capsys, "run", metric_db_path, write(tmp_path, greedy, "g.sql"))
    assert code == 77 and err.startswith("error: budget exceeded on table 'adult': metric "
                                        "epsilon spent 0.5, requested 1.75, limit 2")
    assert "workloads 1, 2" in err
    # the metric model needs delta 0: refused with the workload, nothing spent
    code, out, err = run_cli(capsys, "run", metric_db_path, write(tmp_path, AGE_RANGES, "d.sql"),
                             "--model", "metric", "--epsilon", 0.5, "--delta", 1e-6)
    assert code == 65 and "workload 1" in err and "delta = 0" in err
    with dpsql.connect(metric_db_path) as db:
        assert snapshot(db) == before


def test_metric_model_needs_a_declared_metric(db_path, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", db_path, write(tmp_path, AGE_RANGES), "--model",
                             "metric", "--epsilon", 0.5, "--delta", 0)
    assert code == 65 and "declares no metric model" in err
    with dpsql.connect(db_path) as db:
        assert db.ledger() == []


def test_python_api(db_path):
    with dpsql.connect(db_path) as db:
        outcomes = scripts.run(db, TWO_WORKLOADS)
        assert [o.release.reused for o in outcomes] == [False, False]
        again = scripts.run(db, TWO_WORKLOADS)
        assert [o.release.reused for o in again] == [True, True]
        assert again[0].release.results == outcomes[0].release.results


def test_exit_codes_and_streams_of_the_real_command(db_path, tmp_path):
    def dpsql_cli(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "dpsql", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, input=stdin, timeout=300)

    ok = dpsql_cli("run", db_path, "-", "--quiet", stdin=TWO_WORKLOADS)
    assert ok.returncode == 0 and ok.stderr == "" and len(ok.stdout.splitlines()) == 2
    missing = dpsql_cli("run", db_path, "-", stdin="SELECT COUNT(*) FROM adult")
    assert missing.returncode == 65 and missing.stdout == ""
    assert missing.stderr == ("error: workload 1 (line 1): no epsilon given; put SET "
                              "dpsql.epsilon = <value>; (or an accuracy target, SET "
                              "dpsql.target_rmse = <value>;) before its queries, or give a "
                              "default (--epsilon on the command line)\n")
    bad = dpsql_cli("run", db_path, "-", "--epsilon", 0.1, "--delta", 1e-6,
                    stdin="SELECT COUNT(*) FROM adult;\nSET work_mem = 1;\nSELECT 1")
    assert bad.returncode == 65 and "(line 2, column 5)" in bad.stderr
    assert "Traceback" not in bad.stderr
