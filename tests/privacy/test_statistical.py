"""Released errors match the reported accuracy, with checks that have known power.

Both tests release one batch of 11 answers many times (secure sampler, real pipeline) and
compare the errors against DuckDB's exact answers.

Default run, 60 releases: the pooled standardized errors ``z = error / reported stderr``
(660 of them) must have a root mean square within [1/1.14, 1.14]; 1.14 ≈ √1.3 is the
geometric middle between a right scale and one off by 30%. Power, from the answers' exact
correlation ``C`` (``W (AᵀA)⁺ Wᵀ`` of the chosen strategy, normalised; computed by the test
from the explained plan): ``Σ z²`` is a sum of χ²₁ terms weighted by ``C``'s eigenvalues, so
``mean z²`` ~ ``χ²_ν / ν`` with ν = R · m² / tr(C²) (Satterthwaite; ν ≈ 507 here, the 11
answers are worth about 8.4 independent ones). A right scale fails with probability
≈ 4e-5; a noise scale of 1.3 or 1/1.3 (``mean z²`` → 1.69 or 0.59) passes with probability
≈ 3e-5 and ≈ 6e-6. The test computes these figures and asserts them (≤ 1e-4 each). The 95%
intervals (±1.96 stderr) must cover at least 89% of the exact answers: by the Gaussian's
maximal correlation (|ρ|), the coverage's standard deviation is at most
√(0.95 · 0.05 · Σ|C_ij| / (R m²)) ≈ 1.3%, so a right scale fails that with probability
≈ 4e-6 (asserted ≤ 1e-4).

Slow run (``-m slow``), 200 releases, auto and identity: the empirical RMSE must be within
10% of the reported expected RMSE, and the 95% intervals must cover the exact answers
93-97% of the time. Power: noise scaled by 1.3 or 1/1.3 scales every error by exactly that
factor, so applying the same check to the scaled errors shows it would fail at a 30%
mis-calibration (coverage of a 1.3x-too-wide noise is about 87%, of a 1/1.3 one about 99.5%).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from dpsql.engines import duckdb as data_engine
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

from ..conftest import make_adult_db

BATCH = """
SELECT sex, COUNT(*) FROM adult GROUP BY sex;
SELECT race, COUNT(*) FROM adult WHERE age < 40 GROUP BY race;
SELECT COUNT(*) FROM adult WHERE hours_per_week >= 40 AND income = '>50K';
SELECT COUNT(*) FROM adult WHERE age BETWEEN 25 AND 34 OR race IN ('Black', 'Other');
SELECT income, COUNT(*) FROM adult WHERE sex = 'Female' GROUP BY income;
"""
Z95 = 1.959963984540054


def calibration_check(errors: np.ndarray, stderr: np.ndarray, expected_rmse: float):
    """(passes, empirical RMSE ratio, coverage) for released errors of shape (R, m)."""
    rmse = float(np.sqrt(np.mean(errors ** 2)))
    coverage = float(np.mean(np.abs(errors) <= Z95 * stderr))
    ratio = rmse / expected_rmse
    return (abs(ratio - 1) <= 0.10 and 0.93 <= coverage <= 0.97), ratio, coverage


def compiled(db, sql):
    policy = db.policies()["adult"]
    return policy, compile_workload(parse_batch(sql, lambda name, node: policy), policy)


def exact_answers(db, sql):
    policy, w = compiled(db, sql)
    with db.db.connect() as con:
        cols = [(p.column, policy.column(p.column), p.unit_to_part) for p in w.partitions]
        x = data_engine.data_vector(con, "adult", cols, w.n_cells)
    return np.asarray(w.W @ x).reshape(-1)


def released_errors(db, truth, releases, strategy):
    """(errors of shape (releases, m), reported stderr, expected RMSE, strategy) over
    ``releases`` releases."""
    errors, stderr, r = [], None, None
    for _ in range(releases):
        r = db.answer(BATCH, epsilon=1.0, delta=1e-6, strategy=strategy)
        counts = np.concatenate([[row[-4] for row in t.rows] for t in r.results])
        se = np.concatenate([[row[-3] for row in t.rows] for t in r.results])
        assert stderr is None or np.array_equal(se, stderr)     # the same plan every time
        errors.append(counts - truth)
        stderr = se
    errors = np.array(errors)
    assert errors.shape == (releases, len(truth))
    assert len(db.ledger()) == releases
    return errors, stderr, r.expected_rmse, r.strategy


# ------------------------------------------------------------------ default: pooled z

RELEASES = 60
BAND = 1.14                 # accept RMS(z) in [1/BAND, BAND]; BAND² ≈ 1.3
RISK = 1e-4                 # largest false-alarm and miss probability the test accepts


def answer_correlation(db, sql):
    """The released answers' exact correlation matrix and standard errors (public: the
    explained plan ``A``, the workload ``W`` and σ), and the chosen strategy."""
    e = db.explain(sql, epsilon=1.0, delta=1e-6, strategy="auto")
    chosen = next(c for c in e.candidates
                  if c.strategy == e.strategy and c.mechanism == e.mechanism)
    assert e.mechanism == "gaussian"
    _, w = compiled(db, sql)
    W = w.W.toarray() if sp.issparse(w.W) else np.asarray(w.W @ np.eye(w.n_cells))
    A = chosen.plan.A
    A = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=float)
    cov = chosen.sigma ** 2 * (W @ np.linalg.pinv(A.T @ A) @ W.T)
    se = np.sqrt(np.diag(cov))
    return cov / np.outer(se, se), se, e.strategy


def pooled_power(C: np.ndarray, releases: int) -> tuple[float, float, float]:
    """(ν, false-alarm probability, largest miss probability at a scale off by 30%)."""
    m = len(C)
    nu = releases * m * m / float(np.trace(C @ C))
    lo, hi = 1 / BAND ** 2, BAND ** 2
    false_alarm = stats.chi2.cdf(lo * nu, nu) + stats.chi2.sf(hi * nu, nu)
    miss = max(stats.chi2.cdf(hi * nu / s ** 2, nu) - stats.chi2.cdf(lo * nu / s ** 2, nu)
               for s in (1.3, 1 / 1.3))
    return nu, float(false_alarm), float(miss)


def test_standardized_errors_match_reported_stderr(tmp_path):
    db = make_adult_db(str(tmp_path / "stat.duckdb"), reuse=False, epsilon=10_000, delta=0.5)
    truth = exact_answers(db, BATCH)
    C, se, strategy = answer_correlation(db, BATCH)
    nu, false_alarm, miss = pooled_power(C, RELEASES)
    assert false_alarm <= RISK and miss <= RISK, (nu, false_alarm, miss)
    errors, stderr, expected, released = released_errors(db, truth, RELEASES, "auto")
    assert released == strategy
    np.testing.assert_allclose(stderr, se, rtol=1e-6)     # C is the released answers'
    np.testing.assert_allclose(expected, np.sqrt(np.mean(stderr ** 2)), rtol=1e-9)
    z = errors / stderr
    rms = float(np.sqrt(np.mean(z ** 2)))
    assert 1 / BAND <= rms <= BAND, f"RMS of standardized errors {rms:.3f} (nu={nu:.0f})"
    # coverage: standard deviation <= sqrt(p (1 - p) sum|C| / (R m^2)) by maximal correlation
    coverage = float(np.mean(np.abs(z) <= Z95))
    sd = np.sqrt(0.95 * 0.05 * np.abs(C).sum() / (RELEASES * len(C) ** 2))
    assert (0.95 - 0.89) / sd >= stats.norm.isf(RISK)
    assert coverage >= 0.89, f"coverage {coverage:.3f}"


# ------------------------------------------------------------------ slow: 200 releases

@pytest.mark.slow   # 200 releases (~1 min each): the default run has the pooled test above
@pytest.mark.parametrize("strategy", ["auto", "identity"])
def test_empirical_error_matches_reported_error(tmp_path, strategy):
    db = make_adult_db(str(tmp_path / "stat.duckdb"), reuse=False, epsilon=10_000, delta=0.5)
    truth = exact_answers(db, BATCH)
    errors, stderr, expected, _ = released_errors(db, truth, 200, strategy)
    ok, ratio, coverage = calibration_check(errors, stderr, expected)
    assert ok, f"RMSE ratio {ratio:.3f}, coverage {coverage:.3f}"
    # power: the same check fails when the noise scale is off by 30% either way
    for scale in (1.3, 1 / 1.3):
        bad, ratio_s, coverage_s = calibration_check(errors * scale, stderr, expected)
        assert not bad, f"check cannot detect scale {scale}: {ratio_s:.3f} {coverage_s:.3f}"
