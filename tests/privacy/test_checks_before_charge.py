"""Nothing charged for nothing (issue 22, item 1): every check that depends only on public
inputs runs while planning, before the charge, and explain refuses exactly what answer
refuses. The invariant, over each mechanism's parameter boundaries: refused => nothing
charged (ledger, tables and budget unchanged); charged => released (status 'released',
every result table present)."""

from __future__ import annotations

import copy
import decimal
import subprocess
import sys
from fractions import Fraction

import pytest

from dpsql.mechanisms import catalog as adaptive
from dpsql.interfaces import dbapi
from dpsql.mechanisms.mwem import options as mwem_options
from dpsql.errors import DpsqlError, ParseError, PrivacyParameterError, StrategyError
from dpsql.noise.samplers import SeededTestSampler

from tests.conftest import ADULT_POLICY, ROOT, make_adult_db, snapshot

AGES = "SELECT age, COUNT(*) FROM adult GROUP BY age;"
SMALL = "SELECT sex, COUNT(*) FROM adult GROUP BY sex; SELECT COUNT(*) FROM adult WHERE age < 40"
METRIC = {"epsilon": 1000, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1}}}


def _db(path, *, rows=None):
    """Adult with a large budget (standard and metric); ``rows`` declares the count public."""
    db = make_adult_db(str(path), sampler=SeededTestSampler(3))
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=1000, delta=0.5, metric=METRIC)
    if rows is not None:
        policy["rows"] = rows
    db.protect("adult", policy, replace=True)
    return db


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = _db(tmp_path_factory.mktemp("checks") / "a.duckdb")
    yield d
    d.close()


@pytest.fixture(scope="module")
def dx_db(tmp_path_factory):
    d = _db(tmp_path_factory.mktemp("checks_dx") / "a.duckdb", rows=32561)
    yield d
    d.close()


def _tables(db) -> set:
    with db.db.connect() as con:
        return {r[0].lower() for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}


def attempt(db, sql, **kw) -> str:
    """Explain, then answer; assert the invariant and explain/answer agreement. Returns
    ``"refused"`` or ``"released"``."""
    kw.setdefault("delta", 0)
    explained = None
    try:
        db.explain(sql, **kw)
    except DpsqlError as exc:
        explained = exc
    before, budget = snapshot(db), db.budget("adult")
    try:
        db.answer(sql, **kw)
    except DpsqlError as exc:
        assert snapshot(db) == before and db.budget("adult") == budget, str(exc)
        # explain never accepts what answer then refuses, and says the same
        assert explained is not None, f"explain accepted what answer refused: {exc}"
        assert (type(explained), str(explained)) == (type(exc), str(exc))
        return "refused"
    assert explained is None, f"answer released what explain refused: {explained}"
    entry = db.ledger()[-1]
    assert entry["status"] == "released"
    assert {t.lower() for t in entry["result_tables"]} <= _tables(db)
    return "released"


# ------------------------------------------------------------------ the two findings


@pytest.mark.parametrize("name", ['""', '"   "', '"\t"', '"a\nb"', '"' + "x" * 129 + '"',
                                  "dpsql_ledger", "duckdb_tables", "sqlite_master",
                                  "pg_tables", "adult", "ADULT"])
def test_bad_result_names_are_refused_before_the_charge(db, name):
    with pytest.raises(DpsqlError, match="result table"):
        db.answer(f"CREATE TABLE {name} AS {AGES}", epsilon=0.5, delta=0)
    assert attempt(db, f"CREATE TABLE {name} AS {AGES}", epsilon=0.5) == "refused"
    assert not [e for e in db.ledger() if e["status"] != "released"]


def test_empty_name_retried_never_charges(tmp_path):
    d = _db(tmp_path / "a.duckdb")
    for _ in range(3):
        with pytest.raises(DpsqlError, match="empty or blank"):
            d.answer(f'CREATE TABLE "" AS {AGES}', epsilon=0.5, delta=0)
    assert d.ledger() == [] and d.budget("adult")["epsilon_spent"] == 0


@pytest.mark.parametrize("batch", [f"CREATE TABLE t1 AS {AGES} CREATE TABLE T1 AS {AGES}",
                                   f'CREATE TABLE "Res" AS {AGES} CREATE TABLE res AS {AGES}'])
def test_names_clashing_in_any_case_within_a_batch_are_refused(db, batch):
    assert attempt(db, batch, epsilon=0.5) == "refused"


@pytest.mark.parametrize("strategy", ["mwem(rounds=1000000000)", "dx_mwem(rounds=1000000000)"])
def test_a_billion_rounds_are_refused_by_explain_and_answer_alike(db, dx_db, strategy):
    target = dx_db if strategy.startswith("dx") else db
    kw = {"model": "metric"} if strategy.startswith("dx") else {}
    with pytest.raises(PrivacyParameterError, match="below the smallest the noise samplers"):
        target.explain(AGES, epsilon=0.1, delta=0, strategy=strategy, **kw)
    assert attempt(target, AGES, epsilon=0.1, strategy=strategy, **kw) == "refused"


def test_ten_million_rounds_are_refused_up_front_by_the_time_bound(db):
    """Refused while planning by the predicted run time (before: charged, then ran for
    hours ignoring Ctrl-C). No wall-clock assertion: the refusal names the bound."""
    with pytest.raises(StrategyError, match=r"predicted to run .* limit of 300 s; ask for "
                                            r"fewer rounds"):
        db.answer(AGES, epsilon=0.1, delta=0, strategy="mwem(rounds=10000000)")
    assert attempt(db, AGES, epsilon=0.1, strategy="mwem(rounds=10000000)") == "refused"
    assert attempt(db, AGES, epsilon=0.1, strategy="mwem(rounds=10000000, replay=0)") \
        == "refused"


# ------------------------------------------------------------------ boundaries

#: (strategy, epsilon, expected); epsilon 1e-6 puts the sampler's limit (1e-9 a spend) at
#: 475 rounds: 0.95e-6 for the rounds (1/20 estimates N) / 475 / 2 = 1e-9 exactly
MWEM_CASES = [
    ("mwem(rounds=475, replay=0)", Fraction(1, 10**6), "released"),
    ("mwem(rounds=476, replay=0)", Fraction(1, 10**6), "refused"),
    ("mwem(rounds=1, replay=1000)", 1, "released"),
    ("mwem(rounds=1, replay=1001)", 1, "refused"),
    ("mwem(rounds=0)", 1, "refused"),
    ("mwem(rounds=-1)", 1, "refused"),
    ("mwem(rounds=auto, replay=0)", 1, "released"),
    ("mwem(rounds=2, init_share=0.9)", 1, "released"),
    ("mwem(rounds=2, init_share=1)", 1, "refused"),
    # SMALL has two blocks (sex; age): the init share is split over both
    ("mwem(rounds=2, init_share=0.000000019)", Fraction(1, 10), "refused"),  # 0.95e-9 each
    ("mwem(rounds=2, init_share=0.00000002)", Fraction(1, 10), "released"),  # 1e-9 each
    ("mwem(rounds=2, total_share=0.00000001)", Fraction(1, 10), "released"),
    ("mwem(rounds=2, total_share=0.000000001)", Fraction(1, 10), "refused"),
    ("mwem(rounds=2, total_share=0)", 1, "refused"),
    ("mwem(rounds=2, init_share=0.5, total_share=0.5)", 1, "refused"),
    ("mwem(rounds=2, init=marginals, init_share=0.5, measure=partition)", 1, "released"),
    ("mwem(rounds=2, measure=boxes)", 1, "refused"),
    ("mwem(rounds=2, cuboids=maybe)", 1, "refused"),
    ("mwem(rounds=2, iterate=average, cuboids=true)", 1, "released"),
    ("mwem(rounds=2, rounds=3)", 1, "refused"),
    ("mwem(rounds=١)", 1, "refused"),
    ("mwem(init_share=1e99999999)", 1, "refused"),
]


@pytest.mark.parametrize("strategy, epsilon, expected", MWEM_CASES)
def test_mwem_boundaries(db, strategy, epsilon, expected):
    assert attempt(db, SMALL, epsilon=epsilon, strategy=strategy) == expected


def test_the_time_bound_at_and_just_past_its_limit(db, monkeypatch):
    """Rounds exactly at the work limit run and release; one more round is refused."""
    policies = db.policies()
    policy, queries = db._parse(SMALL, policies)
    _, blocks = adaptive.blocks_for(queries, policy)
    options = adaptive.mwem_options("mwem(rounds=40, replay=3)", policy)
    monkeypatch.setattr(mwem_options, "MAX_WORK", mwem_options.predicted_work(blocks, options))
    assert attempt(db, SMALL, epsilon=1, strategy="mwem(rounds=40, replay=3)") == "released"
    assert attempt(db, SMALL, epsilon=1, strategy="mwem(rounds=41, replay=3)") == "refused"
    assert attempt(db, SMALL, epsilon=1, strategy="mwem(rounds=40, replay=4)") == "refused"


DX_CASES = [
    ("dx_mwem(rounds=3)", 1, "released"),
    ("dx_mwem(rounds=3, replay=1001)", 1, "refused"),
    ("dx_mwem(rounds=3, total_share=0.1)", 1, "refused"),
    ("dx_mwem(rounds=3, init_share=0.0000000001)", Fraction(1, 10), "refused"),
    ("dx_mwem(rounds=10000000)", 1, "refused"),
    ("dx_smalldb(size=1)", 1, "released"),
    ("dx_smalldb(size=0)", 1, "refused"),
    ("dx_smalldb(size=100000)", 1, "refused"),         # candidates past the limit
    ("dx_smalldb(size=٣)", 1, "refused"),
    ("dx_laplace", 1, "released"),
    ("dx_laplace(x=1)", 1, "refused"),
]


@pytest.mark.parametrize("strategy, epsilon, expected", DX_CASES)
def test_metric_boundaries(dx_db, strategy, epsilon, expected):
    assert attempt(dx_db, SMALL, epsilon=epsilon, strategy=strategy, model="metric") \
        == expected


SPEC_CASES = [
    ("hierarchical", "released"),
    ("optimal(tol=0.999)", "released"),
    ("optimal(tol=1)", "refused"),
    ("optimal(tol=0)", "refused"),
    ("optimal(max_iterations=0)", "refused"),
    ("optimal(max_iterations=10001)", "refused"),
    ("optimal(max_iterations=١٠)", "refused"),
    ("eigen(principal_vectors=0)", "refused"),
    ("nosuch", "refused"),
]


@pytest.mark.parametrize("strategy, expected", SPEC_CASES)
def test_matrix_strategy_spec_boundaries(db, strategy, expected):
    assert attempt(db, SMALL, epsilon=Fraction(1, 2), delta=Fraction(1, 10**6),
                   strategy=strategy) == expected


@pytest.mark.parametrize("name, expected", [("x" * 128, "released"), ("x" * 129, "refused"),
                                            ("a b", "released"), ("é_table", "released"),
                                            (" a", "refused"), ("a\u200b", "refused"),
                                            ("a\u00a0b", "refused"), ("dpsqlx", "refused")])
def test_result_name_boundaries(tmp_path, name, expected):
    d = _db(tmp_path / "a.duckdb")
    quoted = '"' + name.replace('"', '""') + '"'
    assert attempt(d, f"CREATE TABLE {quoted} AS {AGES}", epsilon=1) == expected


# ------------------------------------------------------------------ item 5: small inputs


def test_dbapi_decimal_overflow_is_a_pep249_error(tmp_path):
    d = _db(tmp_path / "a.duckdb")
    d.close()
    con = dbapi.connect(str(tmp_path / "a.duckdb"), epsilon=0.5, delta=0)
    cur = con.cursor()
    for value in ("1E+999999999", "-1E+999999999", "1E-999999999"):
        with pytest.raises(dbapi.DataError, match="out of range"):
            cur.execute("SELECT COUNT(*) FROM adult WHERE age < ?", [decimal.Decimal(value)])
    cur.execute("SELECT COUNT(*) FROM adult WHERE age < ?", [decimal.Decimal("-0")])
    con.close()


def test_sqlglot_prints_nothing_to_stderr(db, tmp_path, capfd):
    """Only dpsql's own error reaches stderr (pytest's log capture would hide sqlglot's
    lines in-process, so the analyst's path is run as the CLI)."""
    with pytest.raises(DpsqlError):
        db.explain("SELECT COUNT(*) FROM adult WHERE sex = E'F'", epsilon=0.5, delta=0)
    assert capfd.readouterr().err == ""
    _db(tmp_path / "a.duckdb").close()
    cli = subprocess.run([sys.executable, "-m", "dpsql", "explain", str(tmp_path / "a.duckdb"),
                          "-", "--epsilon", "0.5", "--delta", "0"],
                         input="SELECT COUNT(*) FROM adult WHERE sex = E'F';", text=True,
                         capture_output=True, cwd=str(ROOT), check=False)
    assert cli.returncode != 0 and "Byte strings" not in cli.stderr
    assert cli.stderr.startswith("error:") and len(cli.stderr.strip().splitlines()) == 1


def test_non_ascii_digits_are_refused_by_every_number_reader(tmp_path):
    from dpsql.noise.accounting import number_from_text
    from dpsql.interfaces.shell.settings import parse as shell_parse

    def parse_epsilon(text):
        return shell_parse("epsilon", text)

    def parse_delta(text):
        return shell_parse("delta", text)

    def parse_target(text):
        return shell_parse("target_rmse", text)
    from dpsql.interfaces.scripts import parse_script

    for text in ("١", "0.٥", "１", "1e99999"):
        with pytest.raises(PrivacyParameterError):
            number_from_text(text, "epsilon")
        with pytest.raises(PrivacyParameterError):
            parse_epsilon(text)
        with pytest.raises(PrivacyParameterError):
            parse_delta(text)
        with pytest.raises(DpsqlError):
            parse_target(text)
        with pytest.raises(ParseError):
            parse_script(f"SET dpsql.epsilon = {text};\n{AGES}")
    assert parse_epsilon("0.5") == Fraction(1, 2) and number_from_text("1/10", "e") == \
        Fraction(1, 10)
    with pytest.raises(ParseError, match="ASCII"):
        parse_script(f"SET dpsql.epsilon = ١;\n{AGES}")
    with pytest.raises(StrategyError, match="ASCII"):
        adaptive.mwem_options("mwem(rounds=١)", type("P", (), {"rows": None})())
    _db(tmp_path / "a.duckdb").close()
    cli = subprocess.run([sys.executable, "-m", "dpsql", "run", str(tmp_path / "a.duckdb"),
                          "-", "--epsilon", "١", "--delta", "0"], input=AGES, text=True,
                         capture_output=True, cwd=str(ROOT), check=False)
    assert cli.returncode != 0 and "ASCII" in cli.stderr, cli.stderr
