"""The union-of-Kronecker plan (issue 16) against its dense form on small domains: answers,
exact per-answer variances, the kernel's sensitivity, and the bound of blocks with ranges."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.errors import StrategyError
from dpsql.mechanisms.implicit import KronChoice, ResidualChoice
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_parts
from dpsql.sql.implicit import implicit_workload
from dpsql.sql.parse import parse_batch
from dpsql.strategies import residual, symmetric, union_kron
from dpsql.strategies.bounds import svdb
from dpsql.workload.marginals import computed_l1_sensitivity, computed_l2_sensitivity

SPEC = {"epsilon": 1, "delta": 1e-6, "columns": {
    "age": {"type": "integer", "min": 1, "max": 6},
    "sex": {"type": "categorical", "values": ["F", "M"]},
    "race": {"type": "categorical", "values": ["a", "b", "c"]},
    "h": {"type": "integer", "min": 1, "max": 4}}}

RANGES = [f"SELECT {c}, COUNT(*) FROM t WHERE age BETWEEN {a} AND {b} GROUP BY {c}"
          for c in ("sex", "race") for a in range(1, 7) for b in range(a, 7)]
MIXED = RANGES + [
    "SELECT sex, race, COUNT(*) FROM t GROUP BY sex, race",
    "SELECT COUNT(*) FROM t WHERE h BETWEEN 2 AND 3 AND sex = 'F'",
    "SELECT race, COUNT(*) FROM t WHERE h <= 2 AND age >= 3 GROUP BY race"]


def _workload(sql):
    policy = table_policy_from_spec("t", SPEC)
    queries = parse_batch(sql, lambda name, node: policy)
    return implicit_workload(queries, policy, compile_parts(queries, policy))


def _dense_rows(choice, sizes):
    rows = []
    for meas in choice.plan.measurements:
        M = np.ones((1, 1))
        for i, n in enumerate(sizes):
            M = np.kron(M, meas.factors[meas.columns.index(i)] if i in meas.columns
                        else np.ones((1, n)))
        rows.append(meas.scale * M)
    return np.vstack(rows)


@pytest.mark.parametrize("norm", ["l2", "l1"])
def test_answers_variances_and_sensitivity_against_the_dense_form(norm):
    w = _workload(MIXED)
    choice = KronChoice(w, norm)
    assert [g.gamma for g in choice.kron.groups] == [(), (0,), (0, 3), (3,)]
    S = _dense_rows(choice, w.union.sizes)
    x = np.random.default_rng(0).integers(0, 5, S.shape[1]).astype(float)
    W = np.vstack([w.assemble([b.dense()[:, j] for b in w.union.blocks])
                   for j in range(S.shape[1])]).T
    assert np.abs(choice.answers(S @ x) - W @ x).max() < 1e-8
    # the answers are linear in y: each one's variance is its row's squared norm (unit noise)
    L = np.stack([choice.answers(e) for e in np.eye(S.shape[0])], axis=1)
    assert np.allclose((L ** 2).sum(axis=1), choice._variance, rtol=1e-8, atol=1e-12)
    dense = np.sqrt((S ** 2).sum(axis=0)).max() if norm == "l2" else np.abs(S).sum(axis=0).max()
    kernel = computed_l2_sensitivity(choice.plan) if norm == "l2" else \
        computed_l1_sensitivity(choice.plan)
    assert dense <= kernel <= dense * 1.001
    assert abs(kernel - 1.0) < 1e-3                       # OPT₊ weights: sensitivity 1


def test_kron_beats_the_residual_plan_on_ranges_and_is_near_the_bound():
    w = _workload(RANGES)
    kron = KronChoice(w, "l2")
    rplan = residual.blocks_plan(w.union)
    res = ResidualChoice(w, rplan, residual.as_marginal_plan(rplan))
    mine, theirs = kron.stderr(1.0), res.stderr(1.0)
    assert np.sum(mine ** 2) < 0.95 * np.sum(theirs ** 2)
    W = w.union.dense()
    bound = svdb(W.T @ W)
    assert symmetric.union_svdb(w.union) == pytest.approx(bound, rel=1e-6)
    assert np.sum(mine ** 2) <= 1.3 ** 2 * bound * kron.sensitivity ** 2


def test_bound_with_ranges_equals_the_dense_svdb_and_refuses_mixed_ranges():
    w = _workload(RANGES + [f"SELECT race, h, COUNT(*) FROM t WHERE age BETWEEN {a} AND {b} "
                            "GROUP BY race, h" for a in range(1, 7) for b in range(a, 7)])
    W = w.union.dense()
    assert symmetric.union_svdb(w.union) == pytest.approx(svdb(W.T @ W), rel=1e-6)
    mixed = _workload(RANGES + ["SELECT race, COUNT(*) FROM t WHERE age <> 3 GROUP BY race"])
    with pytest.raises(StrategyError, match="different conditions"):
        symmetric.union_svdb(mixed.union)


def test_no_general_column_leaves_the_residual_plan():
    w = _workload(["SELECT sex, race, COUNT(*) FROM t GROUP BY sex, race",
                   "SELECT race, h, COUNT(*) FROM t GROUP BY race, h"])
    assert union_kron.general_columns(w.union) == ()
    with pytest.raises(StrategyError, match="residual plan serves"):
        union_kron.plan(w.union)
