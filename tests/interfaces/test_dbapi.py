"""The PEP 249 driver (dpsql.interfaces.dbapi): binding, releases, result sets, errors, pandas.

The DB-API compliance suite lives in tests/interfaces/dbapi_compliance.py and is collected here.
"""

from __future__ import annotations

import datetime
import math
import subprocess
import sys
import threading
import warnings
from decimal import Decimal
from fractions import Fraction

import duckdb
import pytest

from dpsql.interfaces import dbapi
from dpsql.errors import (BudgetExceededError, DpsqlError, EngineError, LockTimeoutError,
                          ParseError, PolicyError, PrivacyParameterError, StrategyError,
                          UnknownTableError, UnsupportedQueryError)
from dpsql.session import InterruptedAfterRelease

from ..conftest import ADULT_POLICY, ROOT, make_adult_db, snapshot
from .dbapi_compliance import DpsqlPEP249Test  # noqa: F401  (collected by pytest)
from .dbapi_compliance import dbapi20

if dbapi20 is not None:
    from .dbapi_compliance import DpsqlDBAPI20Test  # noqa: F401  (collected by pytest)

RACES = ADULT_POLICY["columns"]["race"]["values"]
RESULT_COLUMNS = ["count", "stderr", "ci_low", "ci_high"]
METRIC = {"epsilon": 2, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}
AGE_RANGES = ("SELECT COUNT(*) FROM adult WHERE age <= ?; "
              "SELECT COUNT(*) FROM adult WHERE age BETWEEN ? AND ?; "
              "SELECT COUNT(*) FROM adult WHERE age >= ?")


def ledger(conn) -> list[dict]:
    return conn.session.ledger()


def test_public_dbapi20_suite_is_installed():
    if dbapi20 is None:
        pytest.skip("the public suite is not installed (pip install dbapi-compliance); "
                    "its applicable tests still run as DpsqlPEP249Test")


def test_module_globals():
    assert (dbapi.apilevel, dbapi.threadsafety, dbapi.paramstyle) == ("2.0", 2, "qmark")
    assert issubclass(dbapi.BudgetExceeded, dbapi.OperationalError)
    assert issubclass(dbapi.DataError, dbapi.DatabaseError)
    assert not issubclass(dbapi.Warning, dbapi.Error)


# --------------------------------------------------------------------------- binding

def test_parameters_are_bound_as_literals(conn):
    cur = conn.cursor()
    cur.execute("SELECT sex, COUNT(*) FROM adult WHERE ? <= age AND age <= ? "
                "AND hours_per_week >= ? AND race IN (?, ?) GROUP BY sex",
                (30, Decimal("39"), 40.0, "White", "Black"))
    assert [r[0] for r in cur.fetchall()] == ["Female", "Male"]
    text = ledger(conn)[-1]["sql_text"]
    assert text == ("SELECT sex, COUNT(*) FROM adult WHERE 30 <= age AND age <= 39 AND "
                    "hours_per_week >= 40.0 AND race IN ('White', 'Black') GROUP BY sex")


def test_negative_and_exotic_numbers_bind_exactly(conn):
    cur = conn.cursor()
    for value, shown in [(-5, "-5"), (-2.5, "-2.5"), (Decimal("-0.5"), "-0.5"),
                         (Decimal("1E+1"), "1E+1")]:
        cur.execute("SELECT COUNT(*) FROM adult WHERE age >= ?", [value])
        assert ledger(conn)[-1]["sql_text"].endswith(f"age >= {shown}")
    explanation = cur.explain("SELECT COUNT(*) FROM adult WHERE age BETWEEN ? AND ?",
                              [-1, 10**30])
    assert explanation.n_queries == 1


def test_string_parameters_cannot_inject(conn, path):
    before = snapshot(conn.session)
    cur = conn.cursor()
    for attack in ["x' OR 1=1 --", "Female' OR '1'='1", "Female'; DROP TABLE adult; --",
                   "Female\\'; --", "Female' /*", "Male'||'"]:
        with pytest.raises(dbapi.ProgrammingError) as info:
            cur.execute("SELECT COUNT(*) FROM adult WHERE sex = ?", (attack,))
        cause = info.value.__cause__
        assert isinstance(cause, UnsupportedQueryError)
        assert "not in the declared domain" in str(cause)   # one undeclared string value
        assert str(info.value) == str(cause)
    assert snapshot(conn.session) == before                  # nothing charged or written
    conn.close()
    with duckdb.connect(path, read_only=True) as raw:          # never executed
        assert raw.execute("SELECT COUNT(*) FROM adult").fetchone()[0] == 32561


def test_question_marks_inside_strings_and_identifiers_are_not_placeholders(conn):
    cur = conn.cursor()
    cur.execute('SELECT COUNT(*) AS "n?" FROM adult -- who?\n WHERE /* ? */ sex = ?',
                ["Male"])
    assert cur.description[0][0] == "n?"
    with pytest.raises(dbapi.ProgrammingError, match="value '\\?' is not in the declared"):
        cur.execute("SELECT COUNT(*) FROM adult WHERE sex = ? AND race = '?'", ["Male"])


@pytest.mark.parametrize("params, fragment", [
    ((), "1 placeholder(s) but 0"),
    (None, "1 placeholder(s) but 0"),
    ((1, 2), "1 placeholder(s) but 2"),
    ("M", "must be a sequence"),
    ({"a": 1}, "must be a sequence"),
    ((None,), "None"),
    ((True,), "bool"),
    ((b"Male",), "bytes"),
    ((bytearray(b"x"),), "bytearray"),
    ((datetime.date(2000, 1, 1),), "date"),
    ((Fraction(1, 2),), "Fraction"),
    ((float("nan"),), "not finite"),
    ((float("inf"),), "not finite"),
    ((Decimal("NaN"),), "not finite"),
    (([1],), "list"),
])
def test_bad_parameters_are_refused_before_anything_runs(conn, params, fragment):
    before = snapshot(conn.session)
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.cursor().execute("SELECT COUNT(*) FROM adult WHERE age > ?", params)
    assert fragment in str(info.value)
    assert snapshot(conn.session) == before


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM adult WHERE age > $1",
                                 "SELECT COUNT(*) FROM adult WHERE age > :age"])
def test_other_paramstyles_are_refused(conn, sql):
    with pytest.raises(dbapi.ProgrammingError, match="paramstyle is 'qmark'"):
        conn.cursor().execute(sql, (30,))


def test_operation_must_be_text(conn):
    with pytest.raises(dbapi.ProgrammingError, match="SQL text"):
        conn.cursor().execute(b"SELECT COUNT(*) FROM adult")


# --------------------------------------------------------------------------- releases

def test_each_execute_is_one_charge_with_the_current_settings(conn):
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult")
    conn.epsilon = 0.2
    # reuse off: the first release (Laplace at 0.1) answers this query more accurately
    # than Gaussian noise at 0.2 would, so with reuse on it would be free (see
    # test_dbapi_settings.py)
    conn.configure(delta=1e-9, strategy="identity", reuse=False)
    cur.execute("SELECT COUNT(*) FROM adult")
    first, second = ledger(conn)[-2:]
    assert (first["epsilon"], second["epsilon"]) == (0.1, 0.2)
    assert second["delta"] == 1e-9 and second["strategy"] == "identity"
    assert conn.session.budget("adult")["epsilon_spent"] == Fraction(3, 10)
    assert cur.release.release_id == second["release_id"]
    assert (conn.epsilon, conn.delta, conn.strategy, conn.reuse) == (0.2, 1e-9, "identity",
                                                                     False)


def test_settings_are_validated_on_assignment(conn):
    for name, value, match in [("epsilon", 0, "epsilon must be > 0"),
                               ("epsilon", "0.1", "got str"),
                               ("delta", -1e-9, "delta"),
                               ("strategy", "magic", "unknown strategy"),
                               ("strategy", "eigen(bogus=1)", "unknown option 'bogus'"),
                               ("strategy", 3, "must be named by a string"),
                               ("calibration", "textbook", "calibration must be one of"),
                               ("model", "fancy", "model must be 'dp'"),
                               ("model", "metric", "delta = 0")]:
        with pytest.raises(dbapi.ProgrammingError, match=match):
            setattr(conn, name, value)
    with pytest.raises(dbapi.ProgrammingError, match="only valid for epsilon < 1"):
        conn.configure(epsilon=2, calibration="classic")
    with pytest.raises(dbapi.ProgrammingError, match="unknown setting"):
        conn.configure(sigma=1)
    assert (conn.epsilon, conn.delta, conn.strategy, conn.calibration) == (
        0.1, 1e-8, "auto", "analytic")
    conn.configure(epsilon=0.5, calibration="classic")
    assert conn.calibration == "classic"


def test_connect_validates_its_arguments(path):
    with pytest.raises(dbapi.ProgrammingError, match="epsilon"):
        dbapi.connect(path, epsilon=-1, delta=1e-6)
    with pytest.raises(dbapi.ProgrammingError, match="unknown strategy"):
        dbapi.connect(path, epsilon=1, delta=1e-6, strategy="hdmm")
    with pytest.raises(dbapi.ProgrammingError, match="unexpected character '\\?'"):
        dbapi.connect(path, epsilon=1, delta=1e-6, strategy="hdmm?")
    with pytest.raises(dbapi.ProgrammingError, match="metric"):
        dbapi.connect(path, epsilon=1, delta=1e-6, model="metric")
    with pytest.raises(dbapi.ProgrammingError, match="database must be a path"):
        dbapi.connect(3, epsilon=1, delta=1e-6)
    with pytest.raises(TypeError):
        dbapi.connect(path)   # the privacy parameters are never implicit


def test_pure_dp_delta_zero_is_accepted_and_released_with_laplace_noise(conn):
    conn.configure(epsilon=0.25, delta=0)
    assert (conn.epsilon, conn.delta) == (0.25, 0)
    cur = conn.cursor()
    explanation = cur.explain("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
    assert explanation.mechanism == "laplace" and explanation.delta == 0
    cur.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
    assert [r[0] for r in cur.fetchall()] == ["Female", "Male"]
    entry = ledger(conn)[-1]
    assert (entry["mechanism"], entry["epsilon"], entry["delta"]) == ("laplace", 0.25, 0.0)
    assert cur.release.expected_rmse == pytest.approx(explanation.rmse)
    with pytest.raises(dbapi.ProgrammingError, match="classic"):
        conn.calibration = "classic"        # a Gaussian calibration: not with delta = 0


def test_a_pure_dp_budget_accepts_only_delta_zero(tmp_path):
    path = str(tmp_path / "pure.duckdb")
    make_adult_db(path, epsilon=1.0, delta=0).close()
    with dbapi.connect(path, epsilon=0.25, delta=1e-9, strategy="identity") as c:
        cur = c.cursor()
        with pytest.raises(dbapi.BudgetExceeded):       # Gaussian noise asked for: delta
            cur.execute("SELECT COUNT(*) FROM adult WHERE age < 30")
        c.delta = 0
        cur.execute("SELECT COUNT(*) FROM adult WHERE age < 30")
        assert [e["mechanism"] for e in ledger(c)] == ["laplace"]


def test_strategy_specs_with_options(conn):
    conn.strategy = "eigen(principal_vectors=2)"
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult WHERE age < ?; SELECT COUNT(*) FROM adult "
                "WHERE age BETWEEN ? AND ?", [30, 30, 49])
    assert ledger(conn)[-1]["strategy"] == "eigen(principal_vectors=2)"
    before = snapshot(conn.session)
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.strategy = "eigen(principal_vectors=2, colour=red)"
    assert isinstance(info.value.__cause__, StrategyError)
    assert "unknown option 'colour' for strategy 'eigen'" in str(info.value)
    assert "principal_vectors (integer" in str(info.value)    # says what is allowed
    with pytest.raises(dbapi.ProgrammingError, match="mwem has no option 'colour'"):
        conn.configure(strategy="mwem(colour=red)", delta=0)
    assert (conn.strategy, conn.delta) == ("eigen(principal_vectors=2)", 1e-8)
    assert snapshot(conn.session) == before
    conn.configure(strategy="hierarchical", epsilon=0.5, delta=0)
    cur.execute("SELECT COUNT(*) FROM adult WHERE age < 30")
    assert (ledger(conn)[-1]["strategy"], ledger(conn)[-1]["mechanism"]) == (
        "hierarchical", "laplace")


def test_mwem_answers_have_no_standard_error(conn):
    conn.configure(epsilon=0.25, delta=0, strategy="mwem(rounds=5)")
    cur = conn.cursor()
    cur.execute("SELECT sex, COUNT(*) FROM adult WHERE age < ? GROUP BY sex; "
                "SELECT COUNT(*) FROM adult WHERE race = ?", [30, "White"])
    assert ledger(conn)[-1]["mechanism"] == "mwem"
    assert math.isnan(cur.release.expected_rmse)
    rows = cur.fetchall()
    assert [r[0] for r in rows] == ["Female", "Male"]
    assert all(r[2:] == (None, None, None) and isinstance(r[1], float) for r in rows)
    assert [d[1] for d in cur.description] == ["VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE",
                                               "DOUBLE"]
    assert cur.nextset() and cur.fetchone()[1:] == (None, None, None)
    pd = pytest.importorskip("pandas")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        df = pd.read_sql("SELECT race, COUNT(*) FROM adult GROUP BY race", conn)
    assert len(df) == len(RACES) and df["stderr"].isna().all()


@pytest.fixture
def metric_path(tmp_path):
    """Adult under ADULT_POLICY plus a metric (d_X) model with its own budget of 2."""
    p = str(tmp_path / "metric.duckdb")
    db = make_adult_db(p, protect=False)
    db.protect("adult", dict(ADULT_POLICY, metric=METRIC))
    db.close()
    return p


def test_metric_model_releases_charge_the_metric_budget(metric_path):
    with dbapi.connect(metric_path, epsilon=0.5, delta=0, model="metric") as c:
        assert c.model == "metric"
        cur = c.cursor()
        assert cur.explain(AGE_RANGES, [29, 30, 49, 50]).mechanism == "dx_laplace"
        cur.execute(AGE_RANGES, [29, 30, 49, 50])
        assert cur.rowcount == 1 and cur.nextset() and cur.nextset()
        assert isinstance(cur.fetchone()[1], float)          # exact standard errors
        (entry,) = ledger(c)
        assert (entry["mechanism"], entry["metric_epsilon"], entry["epsilon"]) == (
            "dx_laplace", 0.5, 0.0)
        budget = c.session.budget("adult")
        assert (budget["metric_epsilon_spent"], budget["metric_epsilon_remaining"],
                budget["epsilon_spent"]) == (Fraction(1, 2), Fraction(3, 2), 0)
        # the metric model needs delta = 0 and the d_X mechanism: refused at assignment
        for change, match in [(dict(delta=1e-6), "delta = 0"),
                              (dict(strategy="identity"), "dx_laplace")]:
            with pytest.raises(dbapi.ProgrammingError, match=match):
                c.configure(**change)
        c.strategy = "dx_laplace"
        c.epsilon = 1.75
        with pytest.raises(dbapi.BudgetExceeded) as info:
            cur.execute(AGE_RANGES, [29, 30, 49, 50])
        assert info.value.quantity == "metric epsilon" and info.value.limit == 2
        c.configure(model="dp", delta=1e-6, strategy="identity", epsilon=0.1)
        cur.execute(AGE_RANGES, [29, 30, 49, 50])
        assert [e["mechanism"] for e in ledger(c)] == ["dx_laplace", "gaussian"]


def test_explain_charges_nothing_and_matches_the_release(conn):
    cur = conn.cursor()
    before = snapshot(conn.session)
    explanation = cur.explain("SELECT race, COUNT(*) FROM adult WHERE age > ? GROUP BY race",
                              [40])
    assert snapshot(conn.session) == before
    cur.execute("SELECT race, COUNT(*) FROM adult WHERE age > ? GROUP BY race", [40])
    assert cur.release.expected_rmse == pytest.approx(explanation.rmse)


def test_executemany_is_one_workload_and_one_ledger_row(conn):
    cur = conn.cursor()
    n = len(ledger(conn))
    cur.executemany("SELECT COUNT(*) FROM adult WHERE race = ?; "
                    "SELECT sex, COUNT(*) FROM adult WHERE race = ? GROUP BY sex",
                    [(r, r) for r in RACES])
    rows = ledger(conn)
    assert len(rows) == n + 1
    entry = rows[-1]
    assert entry["n_queries"] == 3 * len(RACES) and entry["epsilon"] == 0.1
    for race in RACES:
        assert f"race = '{race}'" in entry["sql_text"]
    shapes = []
    while True:
        shapes.append((cur.rowcount, [d[0] for d in cur.description][0]))
        if not cur.nextset():
            break
    assert shapes == [(1, "count"), (2, "sex")] * len(RACES)
    assert len(cur.release.tables) == 2 * len(RACES)


def test_executemany_refusals_charge_nothing(conn):
    cur = conn.cursor()
    before = snapshot(conn.session)
    with pytest.raises(dbapi.ProgrammingError, match="placeholder"):
        cur.executemany("SELECT COUNT(*) FROM adult WHERE race = ?", [("White",), ()])
    with pytest.raises(dbapi.ProgrammingError, match="not in the declared domain"):
        cur.executemany("SELECT COUNT(*) FROM adult WHERE race = ?", [("White",), ("?",)])
    with pytest.raises(dbapi.ProgrammingError, match="named twice"):
        cur.executemany("CREATE TABLE t AS SELECT COUNT(*) FROM adult WHERE sex = ?",
                        [("Male",), ("Female",)])
    with pytest.raises(dbapi.ProgrammingError, match="sequence of sequences"):
        cur.executemany("SELECT COUNT(*) FROM adult WHERE race = ?", 5)
    cur.executemany("SELECT COUNT(*) FROM adult WHERE race = ?", [])   # nothing to answer
    assert cur.description is None and cur.rowcount == -1
    assert snapshot(conn.session) == before


def test_multi_statement_execute_and_nextset(conn):
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult WHERE sex = ?; "
                "CREATE TABLE by_race AS SELECT race, COUNT(*) FROM adult GROUP BY race; "
                "SELECT sex, race, COUNT(*) FROM adult GROUP BY CUBE(sex, race)", ["Male"])
    assert len(ledger(conn)) == 1 and cur.release.tables[1] == "by_race"
    assert cur.rowcount == 1 and cur.fetchmany(5) and cur.fetchone() is None
    assert cur.nextset() is True
    assert cur.rowcount == len(RACES) and cur.fetchone()[0] == RACES[0]
    assert cur.nextset() is True
    assert [d[0] for d in cur.description] == ["sex", "race", "grouping_id"] + RESULT_COLUMNS
    assert cur.rowcount == 3 * (len(RACES) + 1) == len(list(cur))
    assert cur.nextset() is None and cur.nextset() is None


def test_description_types(conn):
    cur = conn.cursor()
    cur.execute("SELECT sex, age, hours_per_week, COUNT(*) FROM adult "
                "GROUP BY GROUPING SETS ((sex, age, hours_per_week), ())")
    d = cur.description
    assert all(len(col) == 7 and col[2:] == (None,) * 5 for col in d)
    names = [c[0] for c in d]
    assert names == ["sex", "age", "hours_per_week", "grouping_id"] + RESULT_COLUMNS
    types = {c[0]: c[1] for c in d}
    assert types["sex"] == dbapi.STRING and types["sex"] != dbapi.NUMBER
    for col in ["age", "hours_per_week", "grouping_id"] + RESULT_COLUMNS:
        assert types[col] == dbapi.NUMBER and types[col] != dbapi.STRING
    for other in (dbapi.BINARY, dbapi.DATETIME, dbapi.ROWID):
        assert all(c[1] != other for c in d)
    assert (types["age"], types["count"]) == ("BIGINT", "DOUBLE")
    assert dbapi.Binary(b"x") == b"x" and dbapi.Date(2024, 1, 2).year == 2024
    assert dbapi.TimestampFromTicks(0) == datetime.datetime.fromtimestamp(0)


def test_fetch_methods(conn):
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    for call in (cur.fetchone, cur.fetchall, cur.fetchmany, cur.nextset):
        with pytest.raises(dbapi.ProgrammingError, match="no result set"):
            call()
    assert cur.execute("SELECT race, COUNT(*) FROM adult GROUP BY race") is cur
    first = cur.fetchone()
    assert isinstance(first, tuple) and first[0] == RACES[0]
    cur.arraysize = 2
    assert [r[0] for r in cur.fetchmany()] == RACES[1:3]
    assert [r[0] for r in cur.fetchmany(10)] == RACES[3:]
    assert cur.fetchmany() == [] and cur.fetchall() == [] and cur.fetchone() is None
    with pytest.raises(dbapi.ProgrammingError, match="non-negative"):
        cur.fetchmany(-1)
    cur.execute("SELECT race, COUNT(*) FROM adult GROUP BY race")
    assert [r[0] for r in cur] == RACES
    assert cur.connection is conn and cur.lastrowid is None
    cur.setinputsizes([10])
    cur.setoutputsize(10, 0)


def test_a_refused_execute_clears_the_previous_result(conn):
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult")
    with pytest.raises(dbapi.ProgrammingError):
        cur.execute("SELECT MIN(age) FROM adult")
    assert cur.description is None and cur.rowcount == -1
    with pytest.raises(dbapi.ProgrammingError):
        cur.fetchall()


def test_closed_objects_refuse_everything(conn):
    cur = conn.cursor()
    cur.close()
    for call in (lambda: cur.execute("SELECT COUNT(*) FROM adult"), cur.fetchone,
                 cur.fetchall, lambda: cur.executemany("x", []), cur.nextset, cur.close,
                 lambda: cur.explain("SELECT COUNT(*) FROM adult")):
        with pytest.raises(dbapi.ProgrammingError, match="Cursor is closed"):
            call()
    other = conn.cursor()
    other.execute("SELECT COUNT(*) FROM adult")
    conn.close()
    assert other.closed
    with pytest.raises(dbapi.ProgrammingError, match="Cursor is closed"):
        other.fetchone()
    for call in (conn.cursor, conn.commit, conn.rollback, conn.close,
                 lambda: setattr(conn, "epsilon", 0.3)):
        with pytest.raises(dbapi.ProgrammingError, match="Connection is closed"):
            call()


def test_context_managers_close(path):
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as c:
        with c.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM adult")
        assert cur.closed and not c.closed
    assert c.closed
    with dbapi.connect(path, epsilon=0.1, delta=1e-8) as c:
        c.close()   # closing inside the block is fine


def test_commit_is_a_no_op_and_rollback_explains(conn):
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult")
    conn.commit()
    with pytest.raises(dbapi.NotSupportedError, match="cannot be given back"):
        conn.rollback()
    assert len(ledger(conn)) == 1


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("sql, cause", [
    ("SELEC COUNT(*) FROM adult", ParseError),
    ("SELECT COUNT(*) FROM adult a JOIN adult b ON a.age = b.age", UnsupportedQueryError),
    ("SELECT COUNT(*) FROM people", UnknownTableError),
    ("SELECT COUNT(*) FROM adult WHERE hours_per_week > 30", UnsupportedQueryError),
    ("DROP TABLE adult", UnsupportedQueryError),
])
def test_refusals_map_to_programming_error_and_charge_nothing(conn, sql, cause):
    before = snapshot(conn.session)
    with pytest.raises(dbapi.ProgrammingError) as info:
        conn.cursor().execute(sql)
    assert type(info.value.__cause__) is cause
    assert str(info.value) == str(info.value.__cause__)
    assert snapshot(conn.session) == before


def test_budget_exceeded_is_an_operational_error(tmp_path):
    path = str(tmp_path / "small.duckdb")
    make_adult_db(path, epsilon=0.3, delta=1e-5).close()
    with dbapi.connect(path, epsilon=0.2, delta=1e-7) as c:
        cur = c.cursor()
        cur.execute("SELECT COUNT(*) FROM adult")
        before = snapshot(c.session)
        c.reuse = False          # measured afresh: it needs another 0.2
        with pytest.raises(dbapi.BudgetExceeded) as info:
            cur.execute("SELECT COUNT(*) FROM adult")
        assert isinstance(info.value, dbapi.OperationalError)
        assert isinstance(info.value.__cause__, BudgetExceededError)
        assert (info.value.spent, info.value.requested, info.value.limit) == (
            Fraction(1, 5), Fraction(1, 5), Fraction(3, 10))
        assert snapshot(c.session) == before
        # with reuse on, the repeated query is answered from the first release: it needs
        # no budget at all
        c.reuse = True
        cur.execute("SELECT COUNT(*) FROM adult")
        assert (cur.release.epsilon, cur.release.strategy) == (0.0, "reuse")
        assert c.session.budget("adult")["epsilon_spent"] == Fraction(1, 5)


@pytest.mark.parametrize("error, mapped", [
    (PolicyError("p"), dbapi.ProgrammingError),
    (PrivacyParameterError("p"), dbapi.ProgrammingError),
    (StrategyError("s"), dbapi.ProgrammingError),
    (LockTimeoutError("busy"), dbapi.OperationalError),
    (EngineError("engine"), dbapi.InternalError),
    (DpsqlError("other"), dbapi.DatabaseError),
])
def test_every_dpsql_error_maps_onto_the_pep_hierarchy(conn, monkeypatch, error, mapped):
    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(conn.session, "answer", fail)
    cur = conn.cursor()
    with pytest.raises(mapped) as info:
        cur.execute("SELECT COUNT(*) FROM adult")
    assert info.value.__cause__ is error and str(info.value) == str(error)
    assert not isinstance(info.value, dbapi.BudgetExceeded)


def test_an_interrupted_release_keeps_its_answers(conn, monkeypatch):
    release = conn.session.answer("SELECT COUNT(*) FROM adult", epsilon=0.1, delta=1e-8)

    def interrupted(*args, **kwargs):
        raise InterruptedAfterRelease(release)
    monkeypatch.setattr(conn.session, "answer", interrupted)
    cur = conn.cursor()
    with pytest.raises(KeyboardInterrupt):
        cur.execute("SELECT COUNT(*) FROM adult")
    assert cur.release is release and cur.rowcount == 1


def test_threads_share_a_connection(conn):
    errors = []

    def work(k):
        try:
            cur = conn.cursor()
            cur.execute("SELECT race, COUNT(*) FROM adult WHERE age >= ? GROUP BY race",
                        [20 + k])
            assert len(cur.fetchall()) == len(RACES)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ledger(conn)) == 6
    assert conn.session.budget("adult")["epsilon_spent"] == Fraction(6, 10)


# --------------------------------------------------------------------------- pandas

def test_pandas_read_sql(conn):
    pd = pytest.importorskip("pandas")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # pandas: "not SQLAlchemy" warning
        df = pd.read_sql("SELECT sex, race, COUNT(*) FROM adult WHERE age >= ? "
                         "GROUP BY sex, race", conn, params=(40,))
        assert len(ledger(conn)) == 1
        with pytest.raises(dbapi.ProgrammingError):
            pd.read_sql("SELECT * FROM adult", conn)
    assert list(df.columns) == ["sex", "race"] + RESULT_COLUMNS
    assert len(df) == 2 * len(RACES)
    assert df["count"].dtype.kind == "f" and (df["ci_low"] < df["ci_high"]).all()
    assert len(ledger(conn)) == 1


def test_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "dbapi_pandas.py")],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one ledger entry" in done.stdout and "marital_status" in done.stdout
