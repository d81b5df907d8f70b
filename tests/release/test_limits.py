"""Bounded requests (issue 22 item 3): planning memory and time are predicted from the
batch's size before any heavy numerics; candidates over the limits are skipped (and
``explain`` says so); a batch no candidate fits is refused with one clear line, nothing
charged; ``protect`` refuses domains no request could use; a MemoryError never reaches the
user. The limits are lowered through the settings so each finding runs small and fast."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
import scipy.linalg

import dpsql
from dpsql import dbapi
from dpsql.errors import ERROR_TABLE, BatchTooLarge, PolicyError, error_row, one_line
from dpsql.mechanisms import halfwidths, selection
from dpsql.workload import limits as planning
from tests.conftest import make_adult_db

#: the attack's 5-column CUBE, on the test policy's five columns
CUBE = ("SELECT age, sex, race, income, hours_per_week, COUNT(*) FROM adult "
        "GROUP BY CUBE(age, sex, race, income, hours_per_week)")
#: a batch whose dense candidates need more than 1 MiB while the identity fits
WIDE = "SELECT age, race, sex, COUNT(*) FROM adult GROUP BY age, race, sex"


@pytest.fixture(autouse=True)
def dense_form(monkeypatch):
    """These findings are about the dense form's limits. Batches over several columns above
    ``DENSE_MAX_CELLS`` cells now compile to Kronecker blocks (issue 16: the CUBE is then
    planned in milliseconds), so the dense form is forced here."""
    from dpsql.sql import implicit, memo

    monkeypatch.setattr(implicit, "DENSE_MAX_CELLS", 10 ** 12)
    memo.clear()
    yield
    memo.clear()


@pytest.fixture
def no_eigen(monkeypatch):
    """Any lower-bound or eigendecomposition work fails the test: the size checks must
    decide first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("eigendecomposition or svdb ran before the size check")

    for target in (np.linalg, scipy.linalg):
        monkeypatch.setattr(target, "eigvalsh", forbidden)
        monkeypatch.setattr(target, "eigh", forbidden)
    monkeypatch.setattr(halfwidths, "svdb", forbidden)


def _nothing_charged(session) -> None:
    assert session.ledger() == []
    assert session.budget("adult")["epsilon_spent"] == 0


def test_cube_over_the_limit_is_refused_before_any_eigenvalue(db, no_eigen):
    """The 5-column CUBE (finding 1), with max_memory lowered so no candidate fits: one
    line naming the limit, the size and where to split; nothing charged."""
    with dpsql.planning_limits(max_memory=2 ** 20):
        with pytest.raises(BatchTooLarge) as info:
            db.answer(CUBE, epsilon=1, delta=1e-6)
    text = one_line(info.value)
    assert "max_memory = 1 MiB" in text and "cells" in text and "queries" in text
    assert "the cheapest, identity" in text
    assert "statement 1 has" in text and "age, hours_per_week, income, race, sex" in text
    assert "nothing was charged" in text and "Split the batch" in text
    assert "\n" not in str(info.value)
    _nothing_charged(db)


def test_candidate_over_the_limit_is_skipped_and_explain_says_so(db, no_eigen):
    with dpsql.planning_limits(max_memory=2 ** 20):
        expl = db.explain(WIDE, epsilon=1, delta=1e-6)
    assert expl.strategy == "identity"
    skipped = [c for c in expl.candidates if "skipped" in c.note]
    assert {c.strategy for c in skipped} >= {"workload", "eigen", "optimal"}
    assert all("over max_memory = 1 MiB" in c.note for c in skipped)
    text = str(expl)
    assert "skipped: planning it needs about" in text
    assert "lower bound (svdb) not computed" in text
    _nothing_charged(db)


def test_a_named_strategy_over_the_limit_is_refused(db, no_eigen):
    with dpsql.planning_limits(max_memory=2 ** 20):
        with pytest.raises(BatchTooLarge, match="strategy, eigen, needs about"):
            db.answer(WIDE, epsilon=1, delta=1e-6, strategy="eigen")
    _nothing_charged(db)


def test_under_default_limits_every_candidate_is_compared(db):
    expl = db.explain("SELECT age, sex, COUNT(*) FROM adult GROUP BY age, sex", epsilon=1,
                      delta=1e-6)
    assert not [c for c in expl.candidates if "skipped" in c.note]
    assert np.isfinite(expl.bound_rmse)


def test_time_limit_skips_too(db, no_eigen):
    # time_limit bounds the whole request: the release's predicted time, plus a little
    # (room for the cheapest candidate's pricing and step)
    from dpsql.mechanisms import fit, selection

    policy, _, workload = db._compile(WIDE, db.policies())
    cheapest = min(fit.candidate_seconds(workload, *c)
                   for c in selection.requested(policy, 1e-6, "auto"))
    limit = round(fit.release(workload).seconds + cheapest + 1e-3, 6)
    with dpsql.planning_limits(time_limit=limit):
        expl = db.explain(WIDE, epsilon=1, delta=1e-6)
    notes = [c.note for c in expl.candidates if c.strategy == "eigen"]
    assert notes and all(f"over time_limit = {limit:g} s" in n for n in notes)


def test_protect_refuses_a_million_value_column(tmp_path):
    """Finding 2: a 1,000,000-value categorical column is refused, with the reason and the
    limit, and nothing is stored."""
    path = str(tmp_path / "big.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE t AS SELECT 'v1' AS c")
    con.close()
    policy = {"epsilon": 1, "delta": 1e-6,
              "columns": {"c": {"type": "categorical",
                                "values": [f"v{i}" for i in range(1_000_000)]}}}
    with dpsql.connect(path) as session:
        with pytest.raises(PolicyError) as info:
            session.protect("t", policy)
        text = str(info.value)
        assert "column 'c' has 1,000,001 units" in text
        assert "time_limit = 60 s" in text and "units per column" in text
        assert "nothing was stored" in text
        assert session.policies() == {}


def test_protect_refuses_an_integer_domain_over_the_bound(tmp_path):
    path = str(tmp_path / "int.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE t AS SELECT 1 AS k")
    con.close()
    most = planning.max_column_units()
    policy = {"epsilon": 1, "delta": 1e-6,
              "columns": {"k": {"type": "integer", "min": 0, "max": most + 10}}}
    with dpsql.connect(path) as session, pytest.raises(PolicyError, match="units per column"):
        session.protect("t", policy)


def test_a_memory_error_in_planning_becomes_the_refusal(db, monkeypatch):
    """A MemoryError in the lower bound's eigendecomposition (svdb: the bound whenever the
    optimal solver gave none, as here) is the planning-limits refusal."""
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(selection, "certified_bound", lambda evals: math.nan)
    monkeypatch.setattr(halfwidths, "svdb", exhausted)
    with pytest.raises(BatchTooLarge, match="out of memory"):
        db.answer("SELECT race, COUNT(*) FROM adult GROUP BY race", epsilon=1, delta=1e-6)
    _nothing_charged(db)


def test_a_memory_error_while_compiling_becomes_the_refusal(db, monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(planning, "check_grouping", exhausted)
    with pytest.raises(BatchTooLarge, match="too large to compile.*out of memory"):
        db.answer("SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race", epsilon=1,
                  delta=1e-6)
    _nothing_charged(db)


def test_compile_refuses_a_grouping_over_the_time_limit(db):
    with dpsql.planning_limits(time_limit=1e-7):
        with pytest.raises(BatchTooLarge, match="column 'age' has"):
            db.explain("SELECT age, COUNT(*) FROM adult GROUP BY age", epsilon=1,
                       delta=1e-6)


def test_error_row_and_dbapi_settings(tmp_path, no_eigen):
    assert BatchTooLarge in ERROR_TABLE
    assert error_row(BatchTooLarge("x")).exit_status == 65
    make_adult_db(str(tmp_path / "a.duckdb"), epsilon=10.0, delta=1e-3).close()
    with pytest.raises(dbapi.ProgrammingError, match="max_memory"):
        dbapi.connect(str(tmp_path / "a.duckdb"), epsilon=1, delta=1e-6, max_memory=100)
    with pytest.raises(dbapi.ProgrammingError, match="time_limit"):
        dbapi.connect(str(tmp_path / "a.duckdb"), epsilon=1, delta=1e-6, time_limit=0)
    conn = dbapi.connect(str(tmp_path / "a.duckdb"), epsilon=1, delta=1e-6,
                         max_memory=2 ** 20)
    with pytest.raises(dbapi.OperationalError, match="max_memory = 1 MiB"):
        conn.cursor().execute(CUBE)
    expl = conn.cursor().explain(WIDE)
    assert any("skipped" in c.note for c in expl.candidates)
    conn.close()


def test_identity_laplace_halfwidths_per_row_count():
    """Under the identity plan the Laplace half-widths come from each row's count of ones
    (a CUBE over a million cells is not densified row by row); same numbers."""
    import scipy.sparse as sp

    from dpsql.inference.intervals import laplace_interval_halfwidth

    rng = np.random.default_rng(0)
    W = sp.csr_matrix((rng.random((40, 30)) < 0.3).astype(float))
    fast = halfwidths._identity_halfwidths(W)
    assert np.allclose(fast, laplace_interval_halfwidth(W.toarray(), 1.0), rtol=1e-10, atol=0)
    assert halfwidths._identity_halfwidths(W * 0.5) is None


def test_planning_limits_refuse_nonsense():
    from dpsql.errors import PrivacyParameterError

    for bad in ({"max_memory": 0}, {"time_limit": -1}, {"max_memory": True}):
        with pytest.raises(PrivacyParameterError):
            with dpsql.planning_limits(**bad):
                pass
    assert planning.current() == planning.Limits()


def test_the_command_line_and_the_shell_take_the_limits(tmp_path, capsys, no_eigen):
    """``--max-memory`` / ``--time-limit`` come from the one declaration into ``dpsql
    run/explain`` and ``dpsql shell``: the CUBE over 1 MiB is refused with the table's status
    (65) and one line, nothing charged; a bad value is refused like any bad setting."""
    from dpsql.interfaces import cli
    from dpsql.interfaces.shell import app as shell_app

    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=10.0, delta=1e-3).close()
    script = tmp_path / "cube.sql"
    script.write_text(CUBE + ";\n")
    common = ["--epsilon", "1", "--delta", "1e-6", "--max-memory", str(2 ** 20)]
    assert cli.main(["explain", path, str(script), *common]) == 65
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_memory = 1 MiB" in err and len(err.splitlines()) == 1
    assert shell_app.main([path, *common, "-e", CUBE]) == 65
    err = capsys.readouterr().err
    assert "max_memory = 1 MiB" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["run", path, str(script), "--epsilon", "1", "--delta", "1e-6",
                     "--time-limit", "-5"]) == 65
    assert "--time-limit must be a number of seconds" in capsys.readouterr().err
    with dpsql.connect(path) as session:
        _nothing_charged(session)
