"""d_X selection: the exponential mechanism, d_X MWEM and d_X SmallDB (Kamalaruban et al. §3.2).

Per-pair privacy is checked on the mechanisms' own probabilities (50-digit arithmetic from the
exact scores), selection frequencies with a chi-square test of known power, and the release
paths through the session with the seeded sampler."""

from __future__ import annotations

import copy
import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from dpsql.mechanisms.dx import mechanisms as dxm
from dpsql.release import adaptive as session_mod
from dpsql.mechanisms.dx.scales import dx_em_scale
from dpsql.errors import DpsqlError, PolicyError, PrivacyParameterError, StrategyError
from dpsql.kernel.metric_oracle import MetricMeasureOracle
from dpsql.policy.metric import cell_distance_graph
from dpsql.mechanisms.mwem.groups import CandidateGroups, GroupValues
from dpsql.noise.samplers import SeededTestSampler

from ..conftest import ADULT_POLICY, make_adult_db, snapshot
from ..architecture.test_architecture import FORBIDDEN, _closure
from .test_mwem_release import _Recorder
from .test_metric import POLICY, compile_sql, model, ranges
from ..privacy.test_statistical import exact_answers

#: cells on a line: d(i, j) = |pos_i − pos_j| (a metric, far from uniform)
POS = np.array([0.0, 0.5, 1.5, 1.75, 3.0])
D = np.abs(POS[:, None] - POS[None, :])
W = np.array([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 1, 1], [1, 0, 1, 0, 1],
              [0, 0, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=float)
X = np.array([3.0, 1.0, 0.0, 2.0, 4.0])
mpmath.mp.dps = 50


def _log_probs(scores, eps, c):
    """The mechanism's log-probabilities, exp(ε s / (2c)) normalised, to 50 digits."""
    z = [mpmath.mpf(float(eps)) * mpmath.mpf(float(s)) / (2 * mpmath.mpf(c)) for s in scores]
    log_norm = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in z))
    return [v - log_norm for v in z]


def _worst_ratio(score_fn, x, dist, eps, c):
    """max over ordered pairs (i, j) with a record in i, and over outcomes r, of
    |log P_x[r] − log P_x'[r]| / (ε d(i, j)), x' = x with one record moved i → j."""
    base = _log_probs(score_fn(x), eps, c)
    worst = mpmath.mpf(0)
    for i, j in itertools.permutations(range(len(x)), 2):
        if x[i] < 1:
            continue
        moved = x.copy()
        moved[i] -= 1
        moved[j] += 1
        other = _log_probs(score_fn(moved), eps, c)
        loss = max(abs(a - b) for a, b in zip(base, other))
        worst = max(worst, loss / (mpmath.mpf(float(eps)) * mpmath.mpf(float(dist[i, j]))))
    return worst


def _mwem_scores(Wm, est, starts, stops, penalties):
    def scores(x):
        diff = np.abs(est - Wm @ x)
        return np.array([diff[a:b].sum() for a, b in zip(starts, stops)]) - penalties
    return scores


# ------------------------------------------------------------------ per-pair privacy

def _rows_case():
    """Single-row candidates. Moving a record from cell 2 to cell 3 (the closest pair, 0.25
    apart) raises the score of the unlikely row 2 by 1 and lowers the dominant rows 3 and 4
    by 1: the worst case of the bound, so the loss nearly reaches ε·d."""
    x = np.array([1.0, 1, 3, 2, 1])
    est = W @ x
    est[[3, 4]] -= 100
    return x, est, np.arange(6), np.arange(1, 7), np.zeros(6)


def _groups_case():
    """Cuboid-style groups with penalties. Only the group of rows 2–4 separates cells 2 and
    3; moving a record 3 → 2 raises its score by the full 3 = c·d, and nothing moves the other
    way, so the loss is about half the bound."""
    x = np.array([1.0, 1, 3, 2, 1])
    est = W @ x + np.array([-50, 0, 0.5, -0.5, -0.5, -50])
    return x, est, np.array([0, 2, 5]), np.array([2, 5, 6]), np.array([2.0, 3, 1])


@pytest.mark.parametrize("case, least", [("rows", 0.99), ("groups", 0.4), ("smalldb", 0.5)])
def test_em_is_private_on_every_pair_from_its_probabilities(case, least):
    """For every ordered pair of cells and every outcome the log-probability ratio is at
    most ε·d(i, j); the constructed data bring it near the bound (the check has teeth: in
    the rows case a constant 30% too small breaks it)."""
    eps = Fraction(7, 10)
    diffs = dxm.PairDifferences(W, D)
    if case == "smalldb":
        size, total = 3, int(X.sum())
        Y = dxm.smalldb_candidates(5, size)
        c = float(diffs.rows().max()) * size

        def score_fn(x):
            return dxm.smalldb_scores(W, x, Y, size, total)
        data = [X, np.array([0.0, 0, 10, 0, 0])]
    else:
        x, est, starts, stops, pen = _rows_case() if case == "rows" else _groups_case()
        c = float(diffs.groups(starts, stops).max())
        score_fn = _mwem_scores(W, est, starts, stops, pen)
        data = [x, X]
    worst = max(_worst_ratio(score_fn, x, D, eps, c) for x in data)
    assert least < worst <= 1
    if case == "rows":
        assert max(_worst_ratio(score_fn, x, D, eps, c / 1.3) for x in data) > 1


def test_graph_edges_give_the_all_pairs_constant():
    """On a compiled batch the cell graph's edges give the same Lipschitz constant as every
    pair of D*, and it matches dx.dx_em_scale's temperature T = 2c/ε."""
    w = compile_sql([f"SELECT COUNT(*) FROM t WHERE {a} AND {b}" for a, b in
                     zip(ranges("n", 0, 11, 6, seed=9), ranges("k", 0, 4, 6, seed=10))]
                    + ["SELECT race, COUNT(*) FROM t GROUP BY race"])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    dense = g.distances()
    edges, pairs = dxm.PairDifferences(w.W, g), dxm.PairDifferences(w.W, dense)
    np.testing.assert_allclose(edges.rows(), pairs.rows(), rtol=1e-9)
    starts, stops = np.array([0, 3, 6]), np.array([3, 6, w.n_queries])
    np.testing.assert_allclose(edges.groups(starts, stops), pairs.groups(starts, stops),
                               rtol=1e-9)
    c = dxm.score_lipschitz(w.W, g)
    np.testing.assert_allclose(dx_em_scale(w.W, g, Fraction(1, 3)), 2 * c * 3, rtol=1e-9)
    # the mechanism is private on every record pair of the compiled cells, computed exactly
    est = np.linspace(0, 5, w.n_queries)
    m = w.n_queries
    x = np.zeros(w.n_cells)
    x[[0, 7, 19, w.n_cells - 1]] = [2, 1, 3, 1]
    score_fn = _mwem_scores(w.W.toarray(), est, np.arange(m), np.arange(1, m + 1),
                            np.zeros(m))
    assert _worst_ratio(score_fn, x, dense, Fraction(1, 2), c) <= 1


def test_uniform_metric_recovers_the_standard_sensitivity():
    U = np.ones((5, 5)) - np.eye(5)
    assert dxm.score_lipschitz(W, U) == pytest.approx(1.0, rel=1e-9)
    l1 = max(np.abs(W[:, i] - W[:, j]).sum() for i, j in itertools.combinations(range(5), 2))
    assert dxm.score_lipschitz(W, U, form="sum") == pytest.approx(l1, rel=1e-9)
    assert dxm.score_lipschitz(np.ones((2, 5)), U) == 0.0      # no score depends on the data


# ------------------------------------------------------------------ selection frequencies

CRIT = stats.chi2.ppf(0.999, 5)      # 6 candidates


def _chi2(counts, p):
    expected = float(np.sum(counts)) * p
    return float(np.sum((counts - expected) ** 2 / expected))


def test_em_frequencies_match_the_prescribed_probabilities():
    """4,000 seeded draws over 6 candidates (scores 0..5, ε = 1, c = 1), chi-square at
    α = 0.001 (critical value 20.5). Power: drawing at a temperature 30% off gives
    probabilities q with non-centrality n Σ (q − p)² / p = 122 (×1.3) or 140 (÷1.3), so the
    test rejects them with probability > 1 − 1e-9; it does, with these seeds."""
    scores = np.arange(6.0)
    p = np.exp(dxm.dx_exponential_log_probabilities(scores, 1, 1.0))
    n = 4000
    for factor in (1.3, 1 / 1.3):
        q = np.exp(dxm.dx_exponential_log_probabilities(scores, 1, factor))
        assert stats.ncx2.sf(CRIT, 5, n * np.sum((q - p) ** 2 / p)) > 1 - 1e-9

    def draws(lipschitz, seed):
        sampler = SeededTestSampler(seed)
        picks = [dxm.dx_exponential(scores, 1, lipschitz, sampler=sampler) for _ in range(n)]
        return np.bincount(picks, minlength=6)

    assert _chi2(draws(1.0, 11), p) < CRIT
    assert _chi2(draws(1.3, 12), p) > CRIT
    assert _chi2(draws(1 / 1.3, 13), p) > CRIT


def test_smalldb_oracle_draws_the_prescribed_distribution():
    """The kernel's SmallDB selection on a tiny domain (3 cells, 4 records: 15 candidates),
    4,000 seeded draws: chi-square against the probabilities computed from the exact scores
    (none has an expected count below 5 here; they would be pooled), α = 0.001, 14 degrees
    of freedom. Power: a constant 30% off gives non-centrality 159 (×1.3) or 208 (÷1.3),
    rejected with probability > 1 − 1e-9 (checked), and it is, with these seeds."""
    Wt = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1, 0], [1, 1, 0], [0, 1, 1]]))
    x = np.array([3.0, 5.0, 2.0])
    dist = np.array([[0, 1.0, 2.0], [1.0, 0, 1.5], [2.0, 1.5, 0]])
    size, total, eps, n = 4, 10, Fraction(1), 4000
    Y = dxm.smalldb_candidates(3, size)
    c = float(dxm.PairDifferences(Wt, dist).rows().max()) * size
    scores = dxm.smalldb_scores(Wt, x, Y, size, total)

    def prob(lipschitz):
        return np.exp(dxm.dx_exponential_log_probabilities(scores, eps, lipschitz))

    p = prob(c)
    keep = n * p >= 5
    bins = lambda v: np.append(v[keep], v[~keep].sum()) if (~keep).any() else v  # noqa: E731
    dof = int(keep.sum()) - int(keep.all())
    crit = stats.chi2.ppf(0.999, dof)
    for factor in (1.3, 1 / 1.3):
        q = prob(c * factor)
        assert stats.ncx2.sf(crit, dof,
                             n * np.sum((bins(q) - bins(p)) ** 2 / bins(p))) > 1 - 1e-9

    def draws(seed, factor=1.0):
        sampler = SeededTestSampler(seed)
        if factor == 1.0:
            oracle = MetricMeasureOracle([x], [dist], sampler, eps * n)
            picks = [oracle.select_synthetic(0, Wt, Y, size, total, eps) for _ in range(n)]
            assert oracle.spent == eps * n
        else:
            picks = [dxm.dx_exponential(scores, eps, c * factor, sampler=sampler)
                     for _ in range(n)]
        return bins(np.bincount(picks, minlength=Y.shape[0]).astype(float))

    assert _chi2(draws(21), bins(p)) < crit
    assert _chi2(draws(22, 1.3), bins(p)) > crit
    assert _chi2(draws(23, 1 / 1.3), bins(p)) > crit


# ------------------------------------------------------------------ the metric oracle

def test_metric_oracle_computes_its_own_constants():
    Ws = sp.csr_matrix(W)
    rec = _Recorder()
    oracle = MetricMeasureOracle([X], [D], rec, Fraction(1))
    groups = CandidateGroups(Ws, np.array([0, 2]), np.array([2, 5]),
                             group_sensitivity=np.array([1e-6, 1e-6]))   # a lie, ignored
    est = GroupValues(np.zeros(5), groups.offsets)
    oracle.select(0, groups, est, np.zeros(2), Fraction(1, 4))
    kind, scores, eps, c = rec.calls[-1]
    want = float(dxm.PairDifferences(W, D).groups([0, 2], [2, 5]).max())
    assert kind == "em" and eps == Fraction(1, 4) and c == want
    # rows 2, 3 and 4 (the second group) all split the closest cells 1.5, 1.75: 3 / 0.25
    assert c == pytest.approx(12.0, rel=1e-9)
    assert scores.tolist() == [4 + 3, 6 + 7 + 0]
    noisy, b = oracle.measure(0, Ws[[4]], Fraction(1, 2))     # one row: 1 / 0.25 per unit
    assert noisy.tolist() == [0.0] and b == pytest.approx(4 / 0.5, rel=1e-9)
    with pytest.raises(StrategyError, match="more than its charged epsilon"):
        oracle.measure(0, Ws[[0]], Fraction(1, 2))
    assert oracle.spent == Fraction(3, 4)
    oracle.close()
    with pytest.raises(StrategyError, match="closed"):
        oracle.measure(0, Ws[[0]], Fraction(1, 100))


# ------------------------------------------------------------------ SmallDB candidates

@pytest.mark.parametrize("n, m", [(1, 3), (3, 1), (4, 2), (3, 5), (2, 7), (5, 4)])
def test_smalldb_enumerates_every_histogram_once(n, m):
    Y = dxm.smalldb_candidates(n, m).toarray().astype(int)
    brute = {h for h in itertools.product(range(m + 1), repeat=n) if sum(h) == m}
    assert Y.shape == (dxm.smalldb_count(n, m), n) == (len(brute), n)
    assert {tuple(r) for r in Y} == brute


def test_smalldb_refuses_above_the_limit_naming_the_count():
    assert dxm.check_smalldb(20, 5) == math.comb(24, 5)          # 42,504: fine
    with pytest.raises(StrategyError, match=r"C\(40 \+ 6 - 1, 6\) = 8,145,060.*dx_laplace"):
        dxm.check_smalldb(40, 6)
    with pytest.raises(StrategyError, match="size"):
        dxm.check_smalldb(4, 0)


# ------------------------------------------------------------------ through the session

METRIC = {"epsilon": 50, "columns": {"age": {"weight": 0.1}, "sex": {"different": 1},
                                     "race": {"different": 1}}}
BATCH = ";\n".join(
    [f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {a + 9}" for a in range(20, 80, 10)]
    + ["SELECT sex, COUNT(*) FROM adult WHERE age >= 60 GROUP BY sex",
       "SELECT race, COUNT(*) FROM adult GROUP BY race"])
TINY = "SELECT sex, COUNT(*) FROM adult GROUP BY sex; SELECT COUNT(*) FROM adult WHERE age < 40"


def _db(tmp_path, seed=1, file="a.duckdb", rows=32561, **metric):
    db = make_adult_db(str(tmp_path / file), sampler=SeededTestSampler(seed))
    policy = copy.deepcopy(ADULT_POLICY)
    policy.update(epsilon=1, delta=1e-6, metric=dict(METRIC, **metric))
    if rows is not None:
        policy["rows"] = rows
    db.protect("adult", policy, replace=True)
    return db


def _counts(release):
    return np.concatenate([[row[-4] for row in t.rows] for t in release.results])


@pytest.mark.parametrize("spec", ["dx_mwem(rounds=3)", "dx_mwem(rounds=4, cuboids=true)",
                                  "dx_mwem(rounds=2, init_share=0.25, iterate=average)",
                                  "dx_mwem", "dx_smalldb(size=6)"])
def test_recorded_cost_is_exactly_the_requested_metric_epsilon(tmp_path, spec):
    db = _db(tmp_path)
    sql = TINY if "smalldb" in spec else BATCH
    r = db.answer(sql, epsilon=Fraction(3, 10), delta=0, model="metric", strategy=spec)
    b = db.budget("adult")
    assert b["metric_epsilon_spent"] == Fraction(3, 10)
    assert b["epsilon_spent"] == 0 and b["delta_spent"] == 0
    entry = db.ledger()[-1]
    assert entry["mechanism"] == spec.split("(")[0] and entry["status"] == "released"
    assert entry["metric_epsilon"] == 0.3 and entry["epsilon"] == 0
    assert entry["expected_rmse"] is None and r.strategy == spec
    assert all(row[-3] is None and row[-2] is None for t in r.results for row in t.rows)


def test_dx_mwem_is_accurate_at_large_epsilon(tmp_path):
    db = _db(tmp_path, seed=2)
    truth = exact_answers(db, BATCH)
    r = db.answer(BATCH, epsilon=40, delta=0, model="metric", strategy="dx_mwem(rounds=30)")
    assert np.max(np.abs(_counts(r) - truth)) < 0.02 * truth.max()


def test_dx_smalldb_finds_the_best_small_database(tmp_path):
    """At a large ε the selected histogram of m = 12 records is (nearly) the best one: its
    max error is within the EM's slack (2c/ε)(ln|R| + ln 10⁶) of the optimum, computed by
    brute force (fails with probability below 10⁻⁶)."""
    db = _db(tmp_path, seed=3, epsilon=5000)
    truth = exact_answers(db, TINY)
    policy = db.policies()["adult"]
    from dpsql.sql.compile import compile_workload
    from dpsql.sql.parse import parse_batch

    w = compile_workload(parse_batch(TINY, lambda name, node: policy), policy)
    size = 12
    Y = dxm.smalldb_candidates(w.n_cells, size)
    best = np.min(np.max(np.abs(truth[:, None] - 32561 / size * (w.W @ Y.T).toarray()),
                         axis=0))
    r = db.answer(TINY, epsilon=100, delta=0, model="metric",
                  strategy=f"dx_smalldb(size={size})")
    err = np.max(np.abs(_counts(r) - truth))
    assert err <= best + 2 * 10 / 100 * (math.log(Y.shape[0]) + math.log(1e6))
    assert db.budget("adult")["metric_epsilon_spent"] == 100


def test_explain_states_the_bound_and_spends_nothing(tmp_path):
    db = _db(tmp_path)
    before = snapshot(db)
    policies = db.policies()
    e = db._explain_metric(policies, BATCH, Fraction(1, 2), "dx_mwem(rounds=5)")
    assert e.mechanism == "dx_mwem" and np.isnan(e.rmse) and e.n_queries == 13
    note = e.candidates[0].note
    assert "data-dependent" in note and "Thm 5" in note and "Lipschitz constant c = 10" in note
    e = db._explain_metric(policies, TINY, Fraction(1, 2), "dx_smalldb(size=5)")
    assert e.mechanism == "dx_smalldb" and "252 candidate databases" in e.candidates[0].note
    assert db._explain_metric(policies, TINY, 1, "auto").mechanism == "dx_laplace"
    assert snapshot(db) == before


def test_session_explain_routes_every_metric_strategy(tmp_path):
    db = _db(tmp_path)
    assert db.explain(BATCH, epsilon=1, delta=0, model="metric",
                      strategy="dx_mwem(rounds=5)").mechanism == "dx_mwem"
    assert db.explain(TINY, epsilon=1, delta=0, model="metric",
                      strategy="dx_smalldb(size=5)").mechanism == "dx_smalldb"
    assert db.explain(TINY, epsilon=1, delta=0, model="metric").mechanism == "dx_laplace"


def test_aborted_run_refunds_nothing(tmp_path, monkeypatch):
    db = _db(tmp_path)

    def crash(blocks, epsilon, oracle, options):
        oracle.measure(0, sp.identity(blocks[0].n_cells, format="csr"), Fraction(1, 100))
        raise RuntimeError("simulated failure mid-run")

    monkeypatch.setattr(session_mod, "run_mwem", crash)
    with pytest.raises(RuntimeError):
        db.answer(BATCH, epsilon=Fraction(1, 2), delta=0, model="metric", strategy="dx_mwem")
    assert db.budget("adult")["metric_epsilon_spent"] == Fraction(1, 2)
    assert db.ledger()[-1]["status"] == "charged"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(strategy="dx_mwem(rounds=0)"), StrategyError, "rounds"),
    (dict(strategy="dx_mwem(total_share=0.1)"), StrategyError, "no option 'total_share'"),
    (dict(strategy="dx_mwem(colour=red)"), StrategyError, "no option"),
    (dict(strategy="dx_smalldb"), StrategyError, "size"),
    (dict(strategy="dx_smalldb(size=-1)"), StrategyError, "size"),
    (dict(strategy="dx_smalldb(size=40)", sql=BATCH), StrategyError, "candidate databases"),
    (dict(strategy="dx_laplace(x=1)"), StrategyError, "no options"),
    (dict(strategy="mwem"), StrategyError, "dx_mwem"),
    (dict(strategy="dx_mwem", delta=1e-6), PrivacyParameterError, "delta = 0"),
    (dict(strategy="dx_smalldb(size=2)", sql="SELECT COUNT(*) FROM adult"), StrategyError,
     "counts the same on every cell"),
])
def test_bad_requests_are_refused_before_anything_is_charged(tmp_path, kwargs, error, match):
    db = _db(tmp_path)
    before = snapshot(db)
    args = dict(sql=TINY, epsilon=Fraction(1, 2), delta=0, model="metric") | kwargs
    with pytest.raises(error, match=match):
        db.answer(args.pop("sql"), **args)
    assert snapshot(db) == before


def test_synthetic_releases_need_a_public_row_count_and_a_metric(tmp_path):
    db = _db(tmp_path, rows=None)
    before = snapshot(db)
    for spec in ("dx_mwem", "dx_smalldb(size=3)"):
        with pytest.raises(PolicyError, match="rows = "):
            db.answer(TINY, epsilon=1, delta=0, model="metric", strategy=spec)
    plain = make_adult_db(str(tmp_path / "plain.duckdb"))
    with pytest.raises(PolicyError, match="no metric model"):
        plain.answer(TINY, epsilon=1, delta=0, model="metric", strategy="dx_mwem")
    assert snapshot(db) == before
    with pytest.raises(DpsqlError, match="metric epsilon"):     # the metric budget holds
        _db(tmp_path, file="b.duckdb").answer(TINY, epsilon=51, delta=0, model="metric",
                                              strategy="dx_smalldb(size=3)")


def test_named_release_is_returned_again_without_a_charge(tmp_path):
    db = _db(tmp_path)
    r1 = db.answer(TINY, epsilon=1, delta=0, model="metric", strategy="dx_smalldb(size=4)",
                   name="small")
    r2 = db.answer(TINY, epsilon=1, delta=0, model="metric", strategy="dx_smalldb(size=4)",
                   name="small")
    assert r2.reused and _counts(r2).tolist() == _counts(r1).tolist()
    assert db.budget("adult")["metric_epsilon_spent"] == 1


def test_dx_mechanisms_module_is_public_only():
    assert not (_closure("dpsql.mechanisms.dx.mechanisms") & FORBIDDEN)


def test_scripts_and_interfaces_accept_the_metric_strategies():
    from dpsql.errors import StrategyError
    from dpsql.interfaces.scripts import check_strategy, parse_script

    assert check_strategy("dx_mwem(rounds=5)") == "dx_mwem(rounds=5)"
    assert check_strategy("dx_smalldb(size=5)") == "dx_smalldb(size=5)"
    with pytest.raises(StrategyError, match="dx_bogus"):
        check_strategy("dx_bogus")
    script = parse_script("SET dpsql.model = 'metric'; SET dpsql.delta = 0; "
                          "SET dpsql.epsilon = 1; SET dpsql.strategy = 'dx_smalldb(size=4)';"
                          "\nSELECT COUNT(*) FROM adult WHERE age < 30;")
    assert script.workloads[0].strategy == "dx_smalldb(size=4)"
