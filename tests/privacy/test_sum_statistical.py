"""Statistical tests with known power for issue 20: the SUM sensitivity, the user-level bound
and the AVG intervals.

Each test releases the same batch many times through the whole path, takes the errors
against the exact answers (DuckDB's, or the kernel's own noise-free read) and compares them
with a noise scale the test derives on its own from the declared bounds:

- SUM: a batch of one SUM is one block holding the whole budget, so its σ must be the
  analytic Gaussian's at sensitivity ``M = max(|lo|, |hi|)`` (secure sampler). Two bounds
  (``[0, 100]`` and ``CLAMP(…, 0, 50)``) show σ follows ``M``.
- user level: a COUNT on a table with ``max_rows_per_unit = k`` has σ calibrated for
  sensitivity ``k`` (seeded noise at the kernel's σ: reproducible).
- AVG: the delta-method 95% intervals cover the exact averages 94–96% of the time over
  repeated releases (seeded noise, so the figure is reproducible; slow).

Power: the empirical σ is estimated from thousands of errors (relative standard error
≈ 1/√(2n) ≈ 1%), and the same check is run on the errors scaled by 1.3 and 1/1.3 — a noise
scale off by 30% either way — and must fail; for coverage, a 30% error in the scale moves
it to about 87% or 99.5%, outside 94–96%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.kernel.data import _data_vector
from dpsql.noise.gaussian import calibrate_with_rounding
from dpsql.noise.samplers import SeededTestSampler
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

from ..conftest import make_adult_db
from .test_units import K, VISITS, make_visits

EPS, DELTA = 1.0, 1e-6


def scale_check(errors: np.ndarray, sigma: float) -> tuple[bool, float]:
    """(within 10%, ratio): the errors' RMS against σ."""
    ratio = float(np.sqrt(np.mean(errors ** 2))) / sigma
    return abs(ratio - 1) <= 0.10, ratio


def assert_scale_with_power(errors: np.ndarray, sigma: float) -> None:
    ok, ratio = scale_check(errors, sigma)
    assert ok, f"empirical / expected noise scale = {ratio:.3f}"
    for off in (1.3, 1 / 1.3):
        bad, r = scale_check(errors * off, sigma)
        assert not bad, f"the check cannot see a scale off by {off:.2f} ({r:.3f})"


def exact_by_group(db, sql) -> dict:
    with db.db.connect() as con:
        return {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}


def released_errors(db, sql, truth, releases, only=False, **kwargs):
    """(errors, standard errors) of ``releases`` releases of a one-statement batch (groups
    missing from ``truth`` are empty: 0, or skipped when ``only``)."""
    errors, stderr = [], []
    for _ in range(releases):
        (table,) = db.answer(sql, reuse=False, **kwargs).results
        n = len(table.columns) - 4
        for row in table.rows:
            if only and tuple(row[:n]) not in truth:
                continue
            errors.append(row[-4] - truth.get(tuple(row[:n]), 0))
            stderr.append(row[-3])
    return np.asarray(errors, dtype=float), np.asarray(stderr, dtype=float)


@pytest.fixture(scope="module")
def adult(tmp_path_factory):
    db = make_adult_db(str(tmp_path_factory.mktemp("sumstat") / "a.duckdb"), epsilon=10_000,
                       delta=0.5)
    yield db
    db.close()


@pytest.mark.parametrize("clamp, bound", [("hours_per_week", 100),
                                          ("CLAMP(hours_per_week, 0, 50)", 50)])
def test_sum_noise_follows_the_declared_bound(adult, clamp, bound):
    sql = f"SELECT age, SUM({clamp}) FROM adult GROUP BY age"
    truth = exact_by_group(adult, f"SELECT age, SUM(least(greatest(hours_per_week, 0), "
                                  f"{bound})) FROM adult GROUP BY age")
    errors, stderr = released_errors(adult, sql, truth, 20, epsilon=EPS, delta=DELTA,
                                     strategy="identity")
    p = 90 - 17 + 1
    sigma = calibrate_with_rounding(EPS, DELTA, float(bound), p)   # M · σ(1), own grid
    assert errors.size == 20 * p
    # reported as derived: plus the float slack of rounding the exact product once,
    # √p · 2⁻²⁰ relative (dpsql.kernel.joint), and nothing else
    assert np.allclose(stderr, sigma * (1 + math.sqrt(p) * 2.0 ** -20), rtol=1e-7)
    assert_scale_with_power(errors, sigma)


def test_user_level_noise_is_k_times_a_rows(tmp_path):
    db, _ = make_visits(str(tmp_path / "v.duckdb"), sampler=SeededTestSampler(7),
                        policy={**VISITS, "epsilon": 10_000, "delta": 0.5})
    sql = "SELECT item, amount, COUNT(*) FROM visits GROUP BY item, amount"
    policy = db.policies()["visits"]
    queries = parse_batch(sql, lambda n, node: policy)
    w = compile_workload(queries, policy)
    with db.db.connect() as con:
        x = _data_vector(con, policy, w)               # the capped counts, noise-free
    truth = {key: float((w.W[r] @ x)[0]) for r, key in enumerate(w.outputs[0].keys)}
    errors, _ = released_errors(db, sql, truth, 60, epsilon=EPS, delta=DELTA,
                                strategy="identity")
    assert errors.size == 60 * 10
    sigma = calibrate_with_rounding(EPS, DELTA, float(K), w.n_queries)
    assert_scale_with_power(errors, sigma)
    row_level = calibrate_with_rounding(EPS, DELTA, 1.0, w.n_queries)
    assert sigma == pytest.approx(K * row_level, rel=1e-9)
    db.close()


def coverage(errors: np.ndarray, stderr: np.ndarray) -> float:
    return float(np.mean(np.abs(errors) <= 1.959963984540054 * stderr))


@pytest.mark.slow
def test_avg_intervals_cover_95_percent(tmp_path):
    db = make_adult_db(str(tmp_path / "avg.duckdb"), epsilon=10_000, delta=0.5,
                       sampler=SeededTestSampler(2020))
    sql = ("SELECT age, AVG(hours_per_week) FROM adult WHERE age BETWEEN 20 AND 60 "
           "GROUP BY age")
    truth = exact_by_group(db, "SELECT age, AVG(least(greatest(hours_per_week, 0), 100)) "
                               "FROM adult WHERE age BETWEEN 20 AND 60 GROUP BY age")
    errors, stderr = released_errors(db, sql, truth, 120, only=True, epsilon=0.5,
                                     delta=DELTA)
    assert errors.size == 120 * 41 and not np.isnan(errors).any()
    got = coverage(errors, stderr)
    assert 0.94 <= got <= 0.96, got
    for off in (1.3, 1 / 1.3):          # a noise scale misstated by 30% is seen
        assert not 0.94 <= coverage(errors * off, stderr) <= 0.96
    db.close()


def test_avg_is_null_where_the_noisy_count_is_not_positive():
    from dpsql.inference.ratios import ratio

    assert all(math.isnan(v) for v in ratio(10.0, 1.0, 0.0, 1.0, (0, 100)))
    assert all(math.isnan(v) for v in ratio(10.0, 1.0, -0.5, 1.0, (0, 100)))
    avg, se, low, high = ratio(50.0, 1.0, 2.0, 0.1, (0, 20))
    assert avg == 20 and low <= avg <= high <= 20          # clipped to the values' range
    assert se == pytest.approx(math.sqrt(1 / 4 + 2500 * 0.01 / 16))
