"""Released errors match the reported accuracy, with a check that has known power.

Over 200 releases of one batch (secure sampler, real pipeline) the empirical RMSE must be
within 10% of the reported expected RMSE, and the 95% intervals must cover the exact answers
93-97% of the time. Power: noise scaled by 1.3 or 1/1.3 scales every error by exactly that
factor, so applying the same check to the scaled errors shows it would fail at a 30%
mis-calibration (coverage of a 1.3x-too-wide noise is about 87%, of a 1/1.3 one about 99.5%).
"""

from __future__ import annotations

import numpy as np
import pytest


from dpsql.engines import duckdb as data_engine
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

from .conftest import make_adult_db

BATCH = """
SELECT sex, COUNT(*) FROM adult GROUP BY sex;
SELECT race, COUNT(*) FROM adult WHERE age < 40 GROUP BY race;
SELECT COUNT(*) FROM adult WHERE hours_per_week >= 40 AND income = '>50K';
SELECT COUNT(*) FROM adult WHERE age BETWEEN 25 AND 34 OR race IN ('Black', 'Other');
SELECT income, COUNT(*) FROM adult WHERE sex = 'Female' GROUP BY income;
"""


def calibration_check(errors: np.ndarray, stderr: np.ndarray, expected_rmse: float):
    """(passes, empirical RMSE ratio, coverage) for released errors of shape (R, m)."""
    rmse = float(np.sqrt(np.mean(errors ** 2)))
    coverage = float(np.mean(np.abs(errors) <= 1.959963984540054 * stderr))
    ratio = rmse / expected_rmse
    return (abs(ratio - 1) <= 0.10 and 0.93 <= coverage <= 0.97), ratio, coverage


def exact_answers(db, sql):
    policy = db.policies()["adult"]
    queries = parse_batch(sql, lambda name, node: policy)
    w = compile_workload(queries, policy)
    with db.db.connect() as con:
        cols = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
        x = data_engine.data_vector(con, "adult", cols, w.n_cells)
    return np.asarray(w.W @ x).reshape(-1)


@pytest.mark.parametrize("strategy", [
    "auto", pytest.param("identity", marks=pytest.mark.slow)])
def test_empirical_error_matches_reported_error(tmp_path, strategy):
    db = make_adult_db(str(tmp_path / "stat.duckdb"), reuse=False, epsilon=10_000, delta=0.5)
    truth = exact_answers(db, BATCH)
    releases = 200
    errors, stderr, expected = [], None, None
    for _ in range(releases):
        r = db.answer(BATCH, epsilon=1.0, delta=1e-6, strategy=strategy)
        counts = np.concatenate([[row[-4] for row in t.rows] for t in r.results])
        se = np.concatenate([[row[-3] for row in t.rows] for t in r.results])
        errors.append(counts - truth)
        stderr, expected = se, r.expected_rmse
    errors = np.array(errors)
    assert errors.shape == (releases, len(truth))
    ok, ratio, coverage = calibration_check(errors, stderr, expected)
    assert ok, f"RMSE ratio {ratio:.3f}, coverage {coverage:.3f}"
    # power: the same check fails when the noise scale is off by 30% either way
    for scale in (1.3, 1 / 1.3):
        bad, ratio_s, coverage_s = calibration_check(errors * scale, stderr, expected)
        assert not bad, f"check cannot detect scale {scale}: {ratio_s:.3f} {coverage_s:.3f}"
    assert len(db.ledger()) == releases
