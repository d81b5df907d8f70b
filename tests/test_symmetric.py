"""The invariant-block svdb of GROUP BYs without other/NULL (dpsql.strategies.symmetric)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpsql.errors import StrategyError
from dpsql.strategies.bounds import svdb
from dpsql.strategies.gaussian.optimal import solve
from dpsql.strategies.residual import from_union, svdb_marginals
from dpsql.strategies.symmetric import invariant_blocks, restricted_optimum, restricted_svdb
from dpsql.workload.blocks import (KronBlock, UnionWorkload, grouped_factor, identity_factor,
                                   marginal_workload, ones_factor)
from dpsql.workload.matrix import WorkloadInfo


def _grouped(sizes, returned, cliques, weights=None):
    weights = weights or [1.0] * len(cliques)
    return UnionWorkload(tuple(f"c{i}" for i in range(len(sizes))), sizes, tuple(
        KronBlock(tuple(grouped_factor(returned[i], n - returned[i]) if i in B
                        else ones_factor(n) for i, n in enumerate(sizes)), w)
        for B, w in zip(cliques, weights)))


def _dense_svdb(union):
    W = union.dense()
    return svdb(W.T @ W)


def test_notes_worked_example():
    union = _grouped((3, 3, 3, 4), (2, 2, 2, 3), list(itertools.combinations(range(4), 2)))
    assert restricted_svdb(union) == pytest.approx(69.33, abs=5e-3)
    assert restricted_svdb(union) == pytest.approx(_dense_svdb(union), rel=1e-6)
    dims = sum(mult * block.shape[0] for _, mult, block in invariant_blocks(union))
    assert dims <= union.N


def test_mixed_exclusions_weights_and_identities_match_dense():
    sizes, returned = (4, 3, 5, 3), (3, 3, 3, 2)      # column 2: other and NULL excluded
    cliques = [(0, 1), (1, 2, 3), (2,), (0, 3)]
    union = _grouped(sizes, returned, cliques, [1.0, 0.5, 2.0, 3.0])
    extra = KronBlock((identity_factor(4), ones_factor(3), ones_factor(5), ones_factor(3)), 0.7)
    union = UnionWorkload(union.columns, sizes, union.blocks + (extra,))
    assert restricted_svdb(union) == pytest.approx(_dense_svdb(union), rel=1e-6)


def test_full_marginals_reduce_to_the_residual_bound():
    sizes = (3, 4, 2, 5)
    weights = {(0, 1): 1.0, (1, 2, 3): 0.5, (2,): 3.0}
    union = marginal_workload("abcd", sizes, list(weights), list(weights.values()))
    assert restricted_svdb(union) == pytest.approx(svdb_marginals(sizes, weights), rel=1e-12)


def test_predicates_are_refused():
    union = UnionWorkload(("a",), (3,), (KronBlock((np.tril(np.ones((3, 3))),)),))
    with pytest.raises(StrategyError, match="predicate"):
        restricted_svdb(union)


def test_certified_optimum_on_invariant_blocks_matches_the_dense_optimum():
    union = _grouped((3, 3, 3, 4), (2, 2, 2, 3), list(itertools.combinations(range(4), 2)))
    bound = restricted_optimum(union)
    assert bound.lower <= bound.upper <= bound.lower * (1 + 1e-5)
    assert bound.lower == pytest.approx(97.09, abs=5e-3)                 # NOTES' SDP value
    sizes, returned = (4, 3, 5, 3), (3, 3, 3, 2)
    union = _grouped(sizes, returned, [(0, 1), (1, 2, 3), (2,), (0, 3)], [1.0, 0.5, 2.0, 3.0])
    bound = restricted_optimum(union)
    dense = solve(WorkloadInfo.from_matrix(union.dense()))
    assert bound.upper <= bound.lower * (1 + 1e-5)
    assert bound.lower <= dense.upper * dense.scale * (1 + 1e-9)
    assert dense.lower * dense.scale <= bound.upper * (1 + 1e-9)
    assert bound.lower == pytest.approx(dense.upper * dense.scale, rel=2e-5)
    plan = from_union(union)                       # the residual plan is a feasible strategy
    assert plan.total_error >= bound.lower
