"""Metric (d_X) privacy: the declared model, cell distances, and verified Laplace / EM scales."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.mechanisms.dx import scales as dx
from dpsql.policy import metric
from dpsql.errors import PolicyError, StrategyError
from dpsql.mechanisms.dx.scales import dx_em_scale, dx_exponential_epsilon, dx_laplace_scales
from dpsql.policy.metric import cell_distance_graph
from dpsql.policy.record_metric import MetricModel
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch

COLUMNS = {
    "age": {"type": "integer", "min": 0, "max": 7, "nullable": True},
    "race": {"type": "categorical", "values": ["a", "b", "c"]},
    "n": {"type": "integer", "min": 0, "max": 11},
    "k": {"type": "integer", "min": 0, "max": 4},
    "hours": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 10]},
    "sex": {"type": "categorical", "values": ["F", "M"]},
}
POLICY = table_policy_from_spec("t", {"epsilon": 1, "delta": 0, "columns": COLUMNS})
RACE = [[0, 1, 2], [1, 0, 1], [2, 1, 0]]
METRIC = {"epsilon": 1, "columns": {
    "age": {"weight": 0.5, "null": 2},
    "race": {"matrix": RACE, "other": 1.5},
    "n": {"weight": 0.25}, "k": {"weight": 1}, "sex": {"different": 0.7},
    "hours": {"different": 3}}}


def model(spec=None, **columns) -> MetricModel:
    spec = dict(spec or METRIC)
    if columns:
        spec = {"epsilon": 1, "columns": columns}
    return MetricModel.from_dict(spec, table="t", domains=POLICY)


def compile_sql(sql):
    return compile_workload(parse_batch(sql, lambda name, node: POLICY), POLICY)


def ranges(column, lo, hi, count, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        a, b = sorted(int(v) for v in rng.integers(lo, hi + 1, size=2))
        out.append(f"{column} BETWEEN {a} AND {b}")
    return out


# ------------------------------------------------------------------ model validation

@pytest.mark.parametrize("matrix, other, message", [
    ([[0, 1, 2], [1, 0, 1], [3, 1, 0]], 2, "symmetric"),
    ([[0, -1, 2], [-1, 0, 1], [2, 1, 0]], 2, "must be > 0"),
    ([[0, 0, 2], [0, 0, 1], [2, 1, 0]], 2, "must be > 0"),
    ([[1, 1, 2], [1, 0, 1], [2, 1, 0]], 2, "diagonal must be 0"),
    ([[0, 1], [1, 0]], 2, "3 values"),
    ([[0, 1, 2], [1, 0, 1]], 2, "square"),
])
def test_matrix_validation(matrix, other, message):
    with pytest.raises(PolicyError, match=message):
        model(race={"matrix": matrix, "other": other})


def test_triangle_violation_names_the_triple_and_numbers():
    with pytest.raises(PolicyError) as err:
        model(race={"matrix": [[0, 1, 5], [1, 0, 1], [5, 1, 0]], "other": 5})
    text = str(err.value)
    assert "(a, b, c) = (0, 1, 2)" in text
    assert "d(a, c) = 5.0 > d(a, b) + d(b, c) = 1.0 + 1.0" in text


def test_triangle_through_other_and_null():
    with pytest.raises(PolicyError, match=r"\(0, <other>, 2\)"):
        model(race={"matrix": RACE, "other": 0.9})       # 0.9 + 0.9 < 2
    with pytest.raises(PolicyError, match=r"\(0, NULL, 7\)"):
        model(age={"weight": 1, "null": 3})              # 3 + 3 < 7
    # exact arithmetic: 0.1 + 0.2 is exactly 0.3 here, not a float near it
    model(race={"matrix": [[0, 0.1, 0.3], [0.1, 0, 0.2], [0.3, 0.2, 0]], "other": 0.2})


@pytest.mark.parametrize("columns, message", [
    ({"salary": {"weight": 1}}, "does not declare"),
    ({"n": {"weight": 0}}, "must be > 0"),
    ({"n": {"weight": -1}}, "must be > 0"),
    ({"n": {"weight": "abc"}}, "must be a number"),
    ({"n": {"weight": True}}, "must be a number"),
    ({"n": {"weight": float("nan")}}, "finite"),
    ({"n": {"weight": 1, "different": 1}}, "exactly one"),
    ({"n": {"weight": 1, "scale": 2}}, "unknown field"),
    ({"n": {}}, "exactly one"),
    ({"hours": {"weight": 1}}, "numeric column"),
    ({"race": {"weight": 1}}, "integer column"),
    ({"n": {"matrix": [[0]], "other": 1}}, "categorical"),
    ({"race": {"matrix": RACE}}, "other"),
    ({"age": {"weight": 1}}, "nullable"),
    ({"sex": {"different": 1, "null": 1}}, "unknown field"),
])
def test_column_validation(columns, message):
    with pytest.raises(PolicyError, match=message):
        model(**columns)


def test_section_validation_and_round_trip():
    with pytest.raises(PolicyError, match="epsilon"):
        MetricModel.from_dict({"columns": {"n": {"weight": 1}}})
    with pytest.raises(PolicyError, match="must be > 0"):
        MetricModel.from_dict({"epsilon": 0, "columns": {"n": {"weight": 1}}})
    with pytest.raises(PolicyError, match="unknown metric field"):
        MetricModel.from_dict({"epsilon": 1, "delta": 0, "columns": {"n": {"weight": 1}}})
    with pytest.raises(PolicyError, match="at least one"):
        MetricModel.from_dict({"epsilon": 1, "columns": {}})
    m = model()
    assert m.epsilon_per_unit == Fraction(1)
    assert m.column("age").value == Fraction(1, 2)       # 0.5 read exactly
    assert m.column("AGE") is m.column("age")
    again = MetricModel.from_dict(m.describe(), table="t", domains=POLICY)
    assert again == m


# ------------------------------------------------------------------ cell distances

def test_non_contiguous_part_uses_minimum_gap():
    w = compile_sql(["SELECT COUNT(*) FROM t WHERE n < 3 OR n >= 8"])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    assert w.shape == (2,)
    (col,) = g.columns
    # parts {0,1,2,8..11} and {3..7}: closest values 2 and 3 (or 7 and 8), distance 0.25
    assert col.weights == (Fraction(1, 4),)
    assert g.n_edges == 1 and g.d_min == 0.25


def test_grid_graph_shape():
    w = compile_sql(["SELECT n, k, COUNT(*) FROM t GROUP BY n, k"])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    assert w.shape == (12, 5)
    assert g.n_edges == 11 * 5 + 12 * 4
    D = g.distances()
    # D*((n, k), (n', k')) = |n - n'|/4 + |k - k'|
    coords = np.array(list(itertools.product(range(12), range(5))))
    want = (np.abs(coords[:, None, 0] - coords[None, :, 0]) / 4
            + np.abs(coords[:, None, 1] - coords[None, :, 1]))
    np.testing.assert_allclose(D, want, rtol=1e-15)


def test_batch_using_undeclared_column_is_refused():
    w = compile_sql(["SELECT COUNT(*) FROM t WHERE n < 3 AND sex = 'F'"])
    m = model(n={"weight": 1})
    with pytest.raises(PolicyError, match="'sex'.*no distance"):
        cell_distance_graph(m, w.partitions, POLICY)


# ------------------------------------------------------------------ d_X Laplace

def _unit_distance(m: MetricModel, column: str, a: int, b: int) -> Fraction:
    """The declared record distance between two units, straight from the declaration."""
    cm, dom = m.column(column), POLICY.column(column)
    if a == b:
        return Fraction(0)
    if cm.kind == "different":
        return cm.value
    if cm.kind == "matrix":
        k = len(dom.values)
        return cm.matrix[a][b] if a < k and b < k else cm.other
    if dom.null_unit in (a, b):
        return cm.null
    return cm.value * abs(a - b)


def _worst_exact_ratio(m: MetricModel, w, plan, eps: Fraction) -> Fraction:
    """Over every two records (unit tuples of the used columns, NULL and `other` included):
    the largest exact ratio of the privacy loss of moving one record to ``ε·d(u, v)``."""
    inv_b = [Fraction(0) if b == 0 else 1 / Fraction(float(b)) for b in plan.scales]
    W = w.W.toarray().astype(int)
    cols = [p.column for p in w.partitions]
    units = list(itertools.product(*(range(POLICY.column(c).n_units) for c in cols)))
    cell = {u: int(np.ravel_multi_index(
        tuple(p.unit_to_part[x] for p, x in zip(w.partitions, u)), w.shape)) for u in units}
    worst = Fraction(0)
    for u, v in itertools.combinations(units, 2):
        d = sum(_unit_distance(m, c, a, b) for c, a, b in zip(cols, u, v))
        i, j = cell[u], cell[v]
        loss = sum(abs(int(W[k, i]) - int(W[k, j])) * inv_b[k] for k in range(len(inv_b)))
        worst = max(worst, loss / (eps * d))
    return worst


def test_every_record_pair_is_within_budget_exactly():
    """Moving one record from u to v costs at most ε·d(u, v), in exact arithmetic, for every
    u, v; and the optimum actually spends the budget."""
    m = model()
    sql = [f"SELECT COUNT(*) FROM t WHERE {r} AND race = 'b'"
           for r in ranges("age", 0, 7, 4, seed=1)]
    sql += ["SELECT COUNT(*) FROM t WHERE age < 2 OR age >= 6",
            "SELECT race, COUNT(*) FROM t WHERE age IS NOT NULL GROUP BY race",
            "SELECT COUNT(age) FROM t", "SELECT COUNT(*) FROM t"]
    w = compile_sql(sql)
    g = cell_distance_graph(m, w.partitions, POLICY)
    eps = Fraction(3, 2)
    plan = dx_laplace_scales(w.W, g, eps)
    assert plan.exact.tolist() == [False] * (w.n_queries - 1) + [True]   # the total count
    worst = _worst_exact_ratio(m, w, plan, eps)
    assert Fraction(999, 1000) < worst <= 1
    assert plan.max_ratio <= 1 - dx.VERIFY_MARGIN


@pytest.mark.parametrize("sql, distance", [
    # parts {a, c} and {b, other}: the closest members are a–b and c–b, at 1 (not 1.5 or 2)
    (["SELECT COUNT(*) FROM t WHERE race IN ('a', 'c')"], 1),
    # parts {a, b, c} and {other}: `other` is 1.5 from every declared value
    (["SELECT COUNT(*) FROM t WHERE race IN ('a', 'b', 'c')"], 1.5),
    # parts {0, 1, 6, 7} and {2..5} of a nullable column, NULL merged into the second one
    (["SELECT COUNT(*) FROM t WHERE age < 2 OR age >= 6"], 0.5),
    # NULL alone: 2 from every value
    (["SELECT COUNT(*) FROM t WHERE age IS NULL"], 2),
])
def test_merged_parts_use_the_closest_members(sql, distance):
    m = model()
    w = compile_sql(sql)
    g = cell_distance_graph(m, w.partitions, POLICY)
    assert g.d_min == distance
    plan = dx_laplace_scales(w.W, g, 1)
    np.testing.assert_allclose(plan.scales, 1 / distance, rtol=1e-6)
    assert Fraction(999, 1000) < _worst_exact_ratio(m, w, plan, Fraction(1)) <= 1


@pytest.mark.parametrize("case", ["1d", "2d", "categorical"])
def test_edges_and_pairs_programs_agree(case):
    if case == "1d":
        sql = [f"SELECT COUNT(*) FROM t WHERE {r}" for r in ranges("n", 0, 11, 15, seed=2)]
    elif case == "2d":
        sql = [f"SELECT COUNT(*) FROM t WHERE {a} AND {b}" for a, b in
               zip(ranges("n", 0, 11, 12, seed=3), ranges("k", 0, 4, 12, seed=4))]
    else:
        sql = ["SELECT race, COUNT(*) FROM t GROUP BY race",
               "SELECT COUNT(*) FROM t WHERE race IN ('a', 'b')",
               "SELECT COUNT(*) FROM t WHERE race <> 'c' AND n >= 6"]
    w = compile_sql(sql)
    g = cell_distance_graph(model(), w.partitions, POLICY)
    edges = dx_laplace_scales(w.W, g, 1.0, method="edges")
    pairs = dx_laplace_scales(w.W, g, 1.0, method="pairs")
    assert edges.method == "edges" and pairs.method == "pairs"
    assert edges.n_checked == pairs.n_checked == w.n_cells * (w.n_cells - 1) // 2
    np.testing.assert_allclose(edges.scales, pairs.scales, rtol=2e-3)
    # the dense D* matrix as input: implied pairs are pruned, the scales stay the same
    dense = dx_laplace_scales(w.W, g.distances(), 1.0)
    assert dense.method == "pairs-pruned" and dense.n_constraints <= edges.n_constraints
    np.testing.assert_allclose(dense.scales, pairs.scales, rtol=2e-3)


def test_uniform_metric_recovers_standard_dp():
    """d(i, j) = 1 for i ≠ j is change-one-record ε-DP: a histogram needs Lap(2/ε), one
    counting query Lap(1/ε)."""
    eps = 0.5
    n = 6
    hist = dx_laplace_scales(np.eye(n), np.ones((n, n)) - np.eye(n), eps)
    np.testing.assert_allclose(hist.scales, 2 / eps, rtol=1e-4)
    assert hist.n_constraints == n * (n - 1) // 2       # the discrete metric prunes nothing
    single = dx_laplace_scales(np.array([[1, 1, 0, 1, 0, 0]]), np.ones((n, n)) - np.eye(n), eps)
    np.testing.assert_allclose(single.scales, 1 / eps, rtol=1e-6)
    # the same through a `different = 1` column: GROUP BY sex has F, M and the `other` cell
    w = compile_sql(["SELECT sex, COUNT(*) FROM t GROUP BY sex"])
    g = cell_distance_graph(model(sex={"different": 1}), w.partitions, POLICY)
    plan = dx_laplace_scales(w.W, g, eps)
    np.testing.assert_allclose(plan.scales, 2 / eps, rtol=1e-4)
    assert plan.d_min == 1 and plan.baseline_scale == 1 / eps


def test_distance_scaling():
    """Doubling every distance halves the noise (the program is homogeneous)."""
    w = compile_sql([f"SELECT COUNT(*) FROM t WHERE {r}" for r in ranges("n", 0, 11, 8, 5)])
    g1 = cell_distance_graph(model(n={"weight": 1}), w.partitions, POLICY)
    g2 = cell_distance_graph(model(n={"weight": 2}), w.partitions, POLICY)
    np.testing.assert_allclose(dx_laplace_scales(w.W, g2, 1).scales,
                               dx_laplace_scales(w.W, g1, 1).scales / 2, rtol=2e-3)


def test_constant_queries_are_exact_or_refused():
    w = compile_sql(["SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t WHERE n < 4"])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    plan = dx_laplace_scales(w.W, g, 1.0)
    assert plan.scales[0] == 0 and plan.exact.tolist() == [True, False]
    np.testing.assert_allclose(plan.scales[1], 1 / (1.0 * 0.25), rtol=1e-6)
    with pytest.raises(StrategyError, match="constant over all cells"):
        dx_laplace_scales(w.W, g, 1.0, allow_exact=False)
    # a batch that uses no column has one cell: nothing to protect between cells
    w = compile_sql(["SELECT COUNT(*) FROM t"])
    plan = dx_laplace_scales(w.W, cell_distance_graph(model(), w.partitions, POLICY), 1.0)
    assert plan.scales.tolist() == [0.0] and plan.n_checked == 0


def test_verification_refuses(monkeypatch):
    w = compile_sql(["SELECT COUNT(*) FROM t WHERE n < 4"])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    monkeypatch.setattr(dx, "_max_ratio", lambda *args: 1.0)
    with pytest.raises(StrategyError, match="failed verification"):
        dx_laplace_scales(w.W, g, 1.0)


def test_bad_inputs_are_refused():
    D = np.ones((3, 3)) - np.eye(3)
    with pytest.raises(StrategyError, match="columns"):
        dx_laplace_scales(np.eye(4), D, 1.0)
    bad = D.copy()
    bad[0, 1] = 2
    with pytest.raises(StrategyError, match="symmetric"):
        dx_laplace_scales(np.eye(3), bad, 1.0)
    with pytest.raises(StrategyError, match="limited"):
        big = metric.MAX_PAIRS_CELLS + 1
        dx_laplace_scales(sp.eye(big), np.ones((big, big)) - np.eye(big), 1.0)
    with pytest.raises(StrategyError, match="only method='auto' or 'pairs'"):
        dx_laplace_scales(np.eye(3), D, 1.0, method="edges")
    with pytest.raises(PolicyError, match="must be > 0"):
        dx_laplace_scales(np.eye(3), D, 0)


def test_empirical_error_matches_expected_rmse():
    w = compile_sql([f"SELECT COUNT(*) FROM t WHERE {a} AND {b}" for a, b in
                     zip(ranges("n", 0, 11, 40, seed=6), ranges("k", 0, 4, 40, seed=7))])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    plan = dx_laplace_scales(w.W, g, 2.0)
    rng = np.random.default_rng(8)
    noise = rng.laplace(0.0, plan.scales, size=(4000, len(plan.scales)))
    empirical = float(np.sqrt(np.mean(noise ** 2)))
    assert abs(empirical / plan.expected_rmse - 1) < 0.10
    assert plan.expected_rmse < plan.baseline_rmse        # d_X beats Laplace at ε·d_min


# ------------------------------------------------------------------ exponential mechanism

def test_em_temperature_is_private_on_every_pair_exactly():
    w = compile_sql([f"SELECT COUNT(*) FROM t WHERE {a} AND {b}" for a, b in
                     zip(ranges("n", 0, 11, 6, seed=9), ranges("k", 0, 4, 6, seed=10))])
    g = cell_distance_graph(model(), w.partitions, POLICY)
    eps = Fraction(1, 3)
    T = dx_em_scale(w.W, g, eps)
    S = w.W.toarray().astype(int)
    D = g.distances()      # exact enough to compare: sums of quarters and integers
    worst = Fraction(0)
    for i, j in itertools.combinations(range(w.n_cells), 2):
        delta = max(abs(int(a) - int(b)) for a, b in zip(S[:, i], S[:, j]))
        ratio = 2 * delta / (Fraction(T) * eps * Fraction(float(D[i, j])))
        assert ratio <= 1
        worst = max(worst, ratio)
    assert worst > Fraction(999, 1000)
    assert float(eps) * (1 - 1e-9) < dx_exponential_epsilon(w.W, g, T) <= float(eps) * (1 + 1e-9)


def test_em_recovers_standard_exponential_mechanism():
    n = 5
    D = np.ones((n, n)) - np.eye(n)
    S = np.array([[1, 0, 0, 1, 1], [0, 1, 1, 0, 0]])     # two counting scores, Δ = 1
    np.testing.assert_allclose(dx_em_scale(S, D, 0.5), 2 * 1 / 0.5, rtol=1e-9)
    assert dx_em_scale(np.ones((2, n)), D, 0.5) == 0.0    # scores independent of the data
    with pytest.raises(StrategyError, match="temperature"):
        dx_exponential_epsilon(S, D, 0)
