"""Plans on the exact grid: A x exact in float64, sensitivity exact and rounded up."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.kernel import Kernel, _on_grid
from dpsql.strategies.base import Plan, exact_l2_sensitivity, l2_sensitivity, make_plan


@pytest.mark.parametrize("sparse", [False, True])
def test_products_are_exact_and_sensitivity_is_an_upper_bound(sparse):
    rng = np.random.default_rng(3)  # test data only
    for _ in range(20):
        A = rng.normal(size=(25, 12)) * rng.uniform(0.01, 100)
        plan = make_plan("t", sp.csr_matrix(A) if sparse else A)
        M = plan.A.toarray() if sparse else plan.A
        assert _on_grid(plan.A) and np.abs(M).max() == 1.0
        x = rng.integers(0, 2 ** 31, 12).astype(float)   # large counts still exact
        exact = [sum(Fraction(a) * int(v) for a, v in zip(row, x)) for row in M]
        assert [Fraction(v) for v in plan.measure(x)] == exact
        true = max(sum(Fraction(a) ** 2 for a in M[:, j]) for j in range(M.shape[1]))
        assert Fraction(plan.sensitivity) ** 2 >= true
        assert plan.sensitivity == pytest.approx(l2_sensitivity(M), rel=1e-12)


def test_kernel_refuses_plans_off_the_grid():
    A = np.array([[0.1, 1.0], [1.0, 0.3]])  # 0.1 is not a multiple of 2**-20
    plan = Plan("bad", 2, A, exact_l2_sensitivity(np.round(A * 2**20) / 2**20))
    with pytest.raises(StrategyError, match="grid"):
        Kernel().release(None, None, None, plan, 1.0, None)
