"""The invariant-block svdb of GROUP BYs without other/NULL (dpsql.strategies.symmetric)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpsql.errors import StrategyError
from dpsql.strategies.bounds import svdb
from dpsql.strategies.residual import svdb_marginals
from dpsql.strategies.symmetric import invariant_blocks, restricted_svdb
from dpsql.workload.blocks import (KronBlock, UnionWorkload, grouped_factor, identity_factor,
                                   marginal_workload, ones_factor)


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
