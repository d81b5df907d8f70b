"""The implicit path (issue 16): Kronecker blocks against the dense ``W``, the engine's
marginals against its data vector, the kernel's sensitivity against the dense rows, and
DuckDB as the oracle for whole releases over products far above the dense limit."""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import tomllib
from importlib import resources

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.engines import duckdb as data_engine
from dpsql.errors import DpsqlError, UnsupportedQueryError
from dpsql.inference.implicit import residual_block_stderr
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_parts, dense_workload
from dpsql.sql.implicit import (DENSE_MAX_CELLS, ImplicitWorkload, compile_batch,
                                implicit_workload)
from dpsql.sql.parse import parse_batch
from dpsql.strategies.residual import as_marginal_plan, blocks_plan
from dpsql.workload.marginals import computed_l2_sensitivity, l2_bound_squared

DATA = resources.files("dpsql") / "data"
SPEC = tomllib.loads((DATA / "adult_policy.toml").read_text())["tables"]["adult"]
COLS = ["sex", "race", "income", "marital_status", "workclass", "education", "occupation"]


def _policy():
    return table_policy_from_spec("adult", dict(SPEC))


def _queries(sql: str, policy):
    return parse_batch(sql, lambda name, node: policy)


SMALL = """
SELECT sex, race, COUNT(*) FROM adult GROUP BY race, sex;
SELECT income, COUNT(*) FROM adult WHERE sex = 'Male' AND race IN ('White', 'Black')
    AND age BETWEEN 30 AND 39 GROUP BY income;
SELECT sex, income, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY CUBE (sex, income);
SELECT COUNT(workclass) FROM adult WHERE NOT (sex = 'Female');
SELECT race, COUNT(*) FROM adult WHERE FALSE GROUP BY race;
SELECT COUNT(*) FROM adult
"""


def test_blocks_equal_the_dense_rows_on_small_domains():
    policy = _policy()
    queries = _queries(SMALL, policy)
    parts = compile_parts(queries, policy)
    dense = dense_workload(queries, policy, parts)
    implicit = implicit_workload(queries, policy, parts)
    blocks = [b.dense() for b in implicit.union.blocks]
    n = dense.n_cells
    rows = np.vstack([implicit.assemble([B[:, j] for B in blocks]) for j in range(n)]).T
    assert np.array_equal(rows, dense.W.toarray())
    for a, b in zip(dense.outputs, implicit.outputs):
        assert (a.start, a.stop, a.keys, a.grouping_ids) == (b.start, b.stop, b.keys,
                                                             b.grouping_ids)


MERGED = [f"SELECT {c}, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} GROUP BY {c}"
          for c in ("sex", "race") for a, b in ((17, 20), (19, 30), (25, 25), (17, 20))] + [
    "SELECT race, sex, COUNT(*) FROM adult WHERE age >= 22 AND income = '>50K' "
    "GROUP BY race, sex",
    "SELECT sex, race, COUNT(*) FROM adult WHERE age >= 22 AND income = '<=50K' "
    "GROUP BY race, sex",
    "SELECT sex, race, COUNT(*) FROM adult WHERE age < 19 AND income = '<=50K' "
    "GROUP BY sex, race",
    "SELECT COUNT(*) FROM adult WHERE age < 19",
    "SELECT COUNT(*) FROM adult WHERE age < 19 AND sex = 'Male'",
    "SELECT race, COUNT(*) FROM adult WHERE FALSE GROUP BY race"]


def test_statements_of_one_shape_share_a_block():
    """Ranges on one column with the same GROUP BY (and repeats) are one block whose factor
    stacks the ranges; the rows still equal the dense W, statement by statement."""
    policy = _policy()
    queries = _queries(";".join(MERGED), policy)
    parts = compile_parts(queries, policy)
    dense = dense_workload(queries, policy, parts)
    implicit = implicit_workload(queries, policy, parts)
    # sex ranges, race ranges, (race, sex) varying on income, (sex, race) once, the two
    # totals (different filtered columns), WHERE FALSE
    assert len(implicit.union.blocks) == 7
    assert implicit.union.blocks[0].factors[0].shape[0] == 3      # the repeat shares a row
    blocks = [b.dense() for b in implicit.union.blocks]
    rows = np.vstack([implicit.assemble([B[:, j] for B in blocks])
                      for j in range(dense.n_cells)]).T
    assert np.array_equal(rows, dense.W.toarray())


def test_compile_batch_switches_on_the_product_size():
    policy = _policy()
    small = _queries("SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race", policy)
    assert not getattr(compile_batch(small, policy), "implicit", False)
    pairs = ";".join(f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
                     for a, b in itertools.combinations(COLS[:5], 2))
    big = compile_batch(_queries(pairs, policy), policy)
    assert isinstance(big, ImplicitWorkload) and big.n_cells > DENSE_MAX_CELLS
    # an OR across columns is no Kronecker product: dense while the product fits ...
    mixed = _queries(pairs + ";SELECT COUNT(*) FROM adult WHERE sex = 'Male' OR race = 'Black'",
                     policy)
    assert not getattr(compile_batch(mixed, policy), "implicit", False)


def test_too_large_batches_are_refused_with_the_columns_to_split():
    policy = _policy()
    every = ", ".join(COLS + ["age", "hours_per_week", "education_num"])
    q = _queries("SELECT COUNT(*) FROM adult WHERE sex = 'Male' OR race = 'Black';"
                 "SELECT age, education, occupation, COUNT(*) FROM adult "
                 "GROUP BY age, education, occupation;"
                 "SELECT workclass, marital_status, COUNT(*) FROM adult "
                 "GROUP BY workclass, marital_status", policy)
    with pytest.raises(UnsupportedQueryError, match="statement 1 combines columns.*OR/NOT"):
        compile_batch(q, policy)
    q = _queries(f"SELECT {every}, COUNT(*) FROM adult GROUP BY {every}", policy)
    with pytest.raises(UnsupportedQueryError, match="statement 1 reads 10 columns together"):
        compile_batch(q, policy)


def _sensitivity_check(workload):
    rplan = blocks_plan(workload.union)
    mplan = as_marginal_plan(rplan)
    rows = []
    for m in mplan.measurements:
        M = np.ones((1, 1))
        for i, n in enumerate(mplan.sizes):
            F = m.factors[m.columns.index(i)] if i in m.columns else np.ones((1, n))
            M = np.kron(M, F)
        rows.append(m.scale * M)
    A = np.vstack(rows)
    exact = float(np.sqrt((A ** 2).sum(axis=0)).max())
    return exact, math.sqrt(float(l2_bound_squared(mplan))), computed_l2_sensitivity(mplan)


def test_kernel_sensitivity_bounds_the_dense_rows():
    policy = _policy()
    queries = _queries(SMALL, policy)
    workload = implicit_workload(queries, policy, compile_parts(queries, policy))
    exact, bound, computed = _sensitivity_check(workload)
    assert exact <= bound * (1 + 1e-12) and bound <= computed
    assert computed < exact * 1.001            # the float-error slack is small


def test_engine_marginals_sum_the_data_vector():
    policy = _policy()
    queries = _queries(SMALL, policy)
    parts = compile_parts(queries, policy)
    con = duckdb.connect()
    con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                [str(DATA / "adult.csv.gz")])
    columns = [(p.column, policy.column(p.column), p.unit_to_part) for p in parts.partitions]
    x = data_engine.data_vector(con, "adult", columns, parts.n_cells).reshape(parts.shape)
    cliques = [(0, 2), (1,), (), tuple(range(len(parts.shape)))]
    got = data_engine.marginals(con, "adult", columns, cliques)
    for c in cliques:
        axes = tuple(i for i in range(len(parts.shape)) if i not in c)
        assert np.array_equal(got[c], x.sum(axis=axes))


class _NoNoise:
    """Releases the exact measurements (tests only, non-private): answers must then equal
    DuckDB's exact counts up to float rounding."""

    private = False

    def sample(self, values, sigma, *, sensitivity=None):
        return np.asarray(values, dtype=float), 0.0

    def laplace(self, values, scale, *, sensitivity=None, epsilon=None):
        return np.asarray(values, dtype=float), 0.0


_RAW: dict = {}


def _raw_file() -> str:
    """The packaged Adult extract as a DuckDB file, built once per test process: reading the
    gzipped CSV was most of a fresh database's cost, and about 25 tests here and in
    tests/mechanisms start from it (:func:`_database` copies the file)."""
    if "path" not in _RAW:
        path = os.path.join(tempfile.mkdtemp(prefix="dpsql-implicit-"), "raw.duckdb")
        con = duckdb.connect(path)
        con.execute("CREATE TABLE adult AS SELECT * FROM read_csv(?, header = true)",
                    [str(DATA / "adult.csv.gz")])
        con.close()
        _RAW["path"] = path
    return _RAW["path"]


def _database(sampler):
    path = os.path.join(tempfile.mkdtemp(prefix="dpsql-implicit-"), "adult.duckdb")
    shutil.copyfile(_raw_file(), path)
    db = dpsql.connect(path, sampler=sampler)
    db.protect("adult", dict(SPEC, epsilon=100, delta=0.5))
    return db, path


EMPTY_GROUPS = [
    "SELECT workclass, race, sex, COUNT(*) FROM adult WHERE age >= 85 "
    "GROUP BY workclass, race, sex",
    "SELECT occupation, education, COUNT(income) FROM adult WHERE marital_status = "
    "'Married-AF-spouse' AND income = '>50K' GROUP BY education, occupation",
]


@pytest.mark.parametrize("k, delta, strategy", [(5, 1e-6, "residual"), (6, 1e-6, "residual"),
                                                (7, 1e-6, "residual"), (7, 0, "marginals")])
def test_oracle_two_way_marginals_and_empty_groups(k, delta, strategy):
    """Every answer equals DuckDB's (exact measurements), every declared group is present."""
    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(COLS[:k], 2)]
    db, path = _database(_NoNoise())
    release = db.answer(pairs + EMPTY_GROUPS, epsilon=1, delta=delta)
    assert release.strategy == strategy
    db.close()
    con = duckdb.connect(path)
    policy = _policy()
    for sql, table in zip(pairs + EMPTY_GROUPS, release.tables):
        names = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        keys = names[:names.index("stderr") - 1]
        got = con.execute(f"SELECT * FROM {table}").fetchall()
        declared = math.prod(len(policy.column(c).group_units()) for c in keys)
        assert len(got) == declared
        # DuckDB's own answer to the same SQL, keyed by the group (columns in SELECT order)
        truth = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
        for row in got:
            want = truth.get(tuple(row[:len(keys)]), 0)
            assert abs(row[len(keys)] - want) < 1e-6, (sql, row, want)


def test_expected_errors_are_exact_per_answer():
    """Seeded noise over a 991,440-cell batch (three releases): the answers' z-scores against
    their reported standard errors have mean square 1 within 10%. Power: a standard error
    off by ±30% gives a mean square of 1/1.69 or 1/0.49 (0.59 or 2.04), far outside; the
    answers share measurements, but 3 independent releases of 3,000+ answers leave the mean
    square's own spread at a few per cent."""
    from dpsql.noise.samplers import SeededTestSampler

    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(COLS, 2)]
    db, path = _database(SeededTestSampler(7))
    zs = []
    for _ in range(3):
        release = db.answer(pairs, epsilon=1, delta=1e-6)
        with db.db.connect() as con:
            for sql, table in zip(pairs, release.tables):
                cols = sql.split("SELECT ")[1].split(", COUNT")[0]
                truth = dict(((a, b), n) for a, b, n in con.execute(
                    f"SELECT {cols}, count(*) FROM adult GROUP BY ALL").fetchall())
                names = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
                for a, b, v, s in con.execute(
                        f'SELECT {cols}, "{names[2]}", stderr FROM {table}').fetchall():
                    zs.append((v - truth.get((a, b), 0)) / s)
    ms = float(np.mean(np.square(zs)))
    assert len(zs) > 3000 and abs(ms - 1) < 0.1
    db.close()


def test_stderr_matches_the_dense_covariance_on_a_small_domain():
    policy = _policy()
    queries = _queries(SMALL, policy)
    parts = compile_parts(queries, policy)
    dense = dense_workload(queries, policy, parts)
    workload = implicit_workload(queries, policy, parts)
    rplan = blocks_plan(workload.union)
    mplan = as_marginal_plan(rplan)
    A = np.vstack([_rows(m, mplan.sizes) for m in mplan.measurements])
    cov = dense.W.toarray() @ np.linalg.pinv(A.T @ A) @ dense.W.toarray().T
    want = np.sqrt(np.maximum(np.diag(cov), 0))
    got = workload.assemble([residual_block_stderr(rplan.sizes, rplan.a, b)
                             for b in workload.union.blocks])
    assert np.allclose(got, want, rtol=1e-8, atol=1e-9)


def _rows(m, sizes):
    M = np.ones((1, 1))
    for i, n in enumerate(sizes):
        M = np.kron(M, m.factors[m.columns.index(i)] if i in m.columns else np.ones((1, n)))
    return m.scale * M


def test_single_group_by_keeps_laplace_at_sensitivity_one():
    """One GROUP BY over a product above the dense limit: Laplace on its marginal (L1
    sensitivity 1) beats any Gaussian plan at these settings, as the dense identity did."""
    db, _ = _database(_NoNoise())
    sql = "SELECT race, sex, education, occupation, COUNT(*) FROM adult " \
          "GROUP BY race, sex, education, occupation"
    expl = db.explain(sql, epsilon=1, delta=1e-6)
    assert expl.strategy == "marginals" and expl.mechanism == "laplace"
    chosen = next(c for c in expl.candidates if c.strategy == "marginals")
    assert 1.0 <= chosen.sensitivity < 1.001
    assert np.allclose(expl.stderr, math.sqrt(2) * chosen.sigma)
    db.close()


def test_implicit_batch_over_max_memory_is_refused_before_any_charge():
    from dpsql.errors import BatchTooLarge

    db, _ = _database(_NoNoise())
    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(COLS, 2)]
    with dpsql.planning_limits(max_memory=2 ** 18):
        with pytest.raises(BatchTooLarge, match="answers; largest blocks read.*split"):
            db.answer(pairs, epsilon=1, delta=1e-6)
    assert db.ledger() == []
    assert db.explain(pairs, epsilon=1, delta=1e-6).strategy == "residual"
    db.close()


@pytest.mark.parametrize("tamper", ["understated", "scaled"])
def test_kernel_derives_the_marginal_plans_sensitivity_itself(monkeypatch, tamper):
    """A plan whose recorded sensitivity is understated, or whose rows were scaled up after
    σ was calibrated, is refused by the kernel from the factors: nothing charged or read."""
    from dataclasses import replace

    from dpsql.errors import ScaleRefused
    from dpsql.strategies import residual
    from dpsql.workload import marginals

    original = residual.as_marginal_plan

    def tampered(plan, name="residual"):
        mplan = original(plan, name)
        if tamper == "understated":
            object.__setattr__(mplan, "sensitivity", mplan.sensitivity * 0.9)
            return mplan
        first = mplan.measurements[0]
        bigger = marginals.MarginalMeasurement(first.columns, first.factors, first.scale * 1.5)
        out = replace(mplan, measurements=(bigger,) + mplan.measurements[1:])
        object.__setattr__(out, "sensitivity", mplan.sensitivity)
        return out

    monkeypatch.setattr(residual, "as_marginal_plan", tampered)
    db, _ = _database(_NoNoise())
    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(COLS[:5], 2)]
    with pytest.raises(ScaleRefused, match="nothing was charged or read"):
        db.answer(pairs, epsilon=1, delta=1e-6)
    assert db.ledger() == []
    db.close()


def test_blocks_with_ranges_inside_are_compared_with_the_dense_form():
    """Ranges / IN lists inside a block (what the residual plan does not optimise for) mark
    a small implicit batch for auto's comparison with the dense candidates."""
    from dpsql.release.implicit import _has_conditions

    policy = _policy()
    group = "SELECT race, sex, education, occupation, COUNT(*) FROM adult " \
            "GROUP BY race, sex, education, occupation"
    other = "SELECT sex, education, occupation, COUNT(*) FROM adult{} " \
            "GROUP BY sex, education, occupation"
    for where, expected in [("", False), (" WHERE sex = 'Male'", False),
                            (" WHERE age BETWEEN 30 AND 39", False),   # one range: 2 parts
                            (" WHERE race IN ('White', 'Black')", True)]:
        workload = compile_batch(_queries(group + ";" + other.format(where), policy), policy)
        assert isinstance(workload, ImplicitWorkload)
        assert _has_conditions(workload) is expected, where
    overlapping = other.format(" WHERE age BETWEEN 30 AND 39") + ";" + \
        other.format(" WHERE age BETWEEN 35 AND 49")
    assert _has_conditions(compile_batch(_queries(overlapping, policy), policy))


RANGE_MARGINALS = [f"SELECT {c}, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} GROUP BY {c}"
                   for c in ("sex", "race", "education")
                   for a in range(17, 91, 9) for b in range(a + 4, 91, 11)]


@pytest.mark.parametrize("delta, mechanism", [(1e-6, "gaussian"), (0, "laplace")])
def test_oracle_ranges_by_marginals_through_the_kron_plan(delta, mechanism):
    """Ranges on age crossed with 1-way GROUP BYs: the union-of-Kronecker plan is chosen
    (Gaussian with δ > 0, Laplace at δ = 0) and, measured without noise, every answer is
    DuckDB's own, declared-but-empty groups included."""
    db, path = _database(_NoNoise())
    expl = db.explain(RANGE_MARGINALS, epsilon=1, delta=delta)
    assert (expl.strategy, expl.mechanism) == ("kron", mechanism)
    release = db.answer(RANGE_MARGINALS, epsilon=1, delta=delta)
    db.close()
    con = duckdb.connect(path)
    for sql, table in zip(RANGE_MARGINALS, release.tables):
        got = con.execute(f"SELECT * FROM {table}").fetchall()
        truth = dict(con.execute(sql).fetchall())
        assert len(got) == len(_policy().column(sql.split()[1].rstrip(",")).group_units())
        for row in got:
            want = truth.get(row[0], 0)       # pseudo-inverses of solved factors: ~1e-10 rel.
            assert abs(row[1] - want) < 1e-6 + 1e-9 * want, (sql, row)


@pytest.mark.parametrize("delta", [1e-6, 0])
def test_kernel_refuses_a_tampered_kron_plan(monkeypatch, delta):
    """A union-of-Kronecker plan (Gaussian or Laplace) whose first measurement was scaled up
    after its noise scale was set is refused by the kernel, which derives the sensitivity
    from the factors itself: nothing charged or read."""
    from dataclasses import replace

    from dpsql.errors import ScaleRefused
    from dpsql.mechanisms.implicit import KronChoice
    from dpsql.workload import marginals

    original = KronChoice.__init__

    def tampered(self, workload, norm):
        original(self, workload, norm)
        first = self.plan.measurements[0]
        bigger = marginals.MarginalMeasurement(first.columns, first.factors, first.scale * 1.5)
        plan = replace(self.plan, measurements=(bigger,) + self.plan.measurements[1:])
        object.__setattr__(plan, "sensitivity", self.plan.sensitivity)
        self.plan = plan

    monkeypatch.setattr(KronChoice, "__init__", tampered)
    db, _ = _database(_NoNoise())
    assert db.explain(RANGE_MARGINALS, epsilon=1, delta=delta).strategy == "kron"
    with pytest.raises(ScaleRefused, match="nothing was charged or read"):
        db.answer(RANGE_MARGINALS, epsilon=1, delta=delta)
    assert db.ledger() == []
    db.close()


def test_metric_requests_over_blocks_are_refused_up_front():
    """d_X needs the cell product (its metric is checked edge by edge): a batch whose product
    only the implicit path serves is refused before anything is charged, saying why."""
    every = COLS + ["age", "education_num", "hours_per_week"]
    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(every, 2)]
    db, _ = _database(_NoNoise())
    for strategy in ("dx_laplace", "dx_smalldb(size=20)"):
        with pytest.raises(UnsupportedQueryError, match="not supported over Kronecker blocks"):
            db.answer(pairs, epsilon=1, delta=0, model="metric", strategy=strategy)
    assert db.ledger() == []
    db.close()


def test_a_named_dense_strategy_is_refused_clearly_on_wide_batches():
    """A named dense strategy needs the full product: over the dense limit it is refused up
    front, naming what and how to ask instead."""
    every = COLS + ["age", "education_num", "hours_per_week"]
    pairs = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(every, 2)]
    db, _ = _database(_NoNoise())
    with pytest.raises(UnsupportedQueryError, match="do not serve it yet; nothing was charged"):
        db.answer(pairs, epsilon=1, delta=1e-6, strategy="identity")
    assert db.ledger() == []
    db.close()


WIDE = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
        for a, b in itertools.combinations(COLS + ["age", "hours_per_week"], 2)]


@pytest.mark.parametrize("delta, conditions", [(1e-6, False), (0, False), (1e-6, True)])
def test_non_negative_integer_answers_on_a_wide_batch_are_exact_without_noise(delta,
                                                                               conditions):
    """Exact measurements: the least-squares answers are already non-negative and
    consistent, so the estimate (started from the plan's own least-squares marginals:
    residual, marginals, or the kron plan when some blocks hold conditions) returns them,
    and every answer is DuckDB's own count, declared-but-empty groups included."""
    db, path = _database(_NoNoise())
    columns = ["sex", "race", "age", "workclass"] if conditions else COLS
    batch = [f"SELECT {a}, {b}, COUNT(*) FROM adult GROUP BY {a}, {b}"
             for a, b in itertools.combinations(columns, 2)]
    batch += EMPTY_GROUPS if conditions else []
    release = db.answer(batch, epsilon=1, delta=delta, nonnegative=True, integer=True)
    assert (release.strategy == "kron") == conditions
    db.close()
    con = duckdb.connect(path)
    for sql, table in zip(batch, release.tables):
        names = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        k = names.index("stderr") - 1
        truth = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
        for row in con.execute(f"SELECT * FROM {table}").fetchall():
            assert row[k] == truth.get(tuple(row[:k]), 0), (sql, row)


def test_non_negative_answers_on_a_wide_batch_cost_nothing_extra_and_say_so():
    """Seeded noise at a small ε: the plain answers go below zero; the non-negative ones do
    not, are whole numbers, keep the plain release's standard errors (the tables say so)
    and, being a projection of the least-squares answers onto a convex set that holds the
    truth, have no larger total squared error."""
    from dpsql.noise.samplers import SeededTestSampler

    db, path = _database(SeededTestSampler(5))
    exact, _ = _database(_NoNoise())
    truth = [r[-4] for t in exact.answer(WIDE, epsilon=1, delta=1e-6).results for r in t.rows]
    exact.close()
    plain = db.answer(WIDE, epsilon=0.2, delta=1e-6)
    posted = db.answer(WIDE, epsilon=0.2, delta=1e-6, nonnegative=True, integer=True)
    assert posted.strategy == plain.strategy == "residual"
    flat = [[r for t in rel.results for r in t.rows] for rel in (plain, posted)]
    assert min(r[-4] for r in flat[0]) < -10
    assert all(r[-4] >= 0 and r[-4] == int(r[-4]) for r in flat[1])
    assert [r[-3] for r in flat[0]] == [r[-3] for r in flat[1]]
    error = [sum((r[-4] - t) ** 2 for r, t in zip(rows, truth)) for rows in flat]
    assert error[1] < error[0]
    with db.db.connect() as con:
        comments = {n: c for n, c in con.execute(
            "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert all("local polytope" in comments[t] and "unconstrained" in comments[t]
               for t in posted.tables)
    spent = db.budget("adult")["epsilon_spent"]
    assert spent == pytest.approx(0.4)
    db.close()


def test_non_negative_answers_over_the_limits_are_refused_before_any_charge():
    """The request itself fits in 1 s (predicted 0.6 s); 100 rounds of the estimate do not
    (predicted 2 s): refused before the charge, naming the estimate."""
    db, _ = _database(_NoNoise())
    with dpsql.planning_limits(time_limit=1.0):
        with pytest.raises(DpsqlError, match="nonnegative answers for this batch are too "
                                             "costly.*over time_limit.*nothing was charged"):
            db.answer(WIDE, epsilon=1, delta=1e-6, nonnegative=True)
    assert db.ledger() == []
    db.close()
