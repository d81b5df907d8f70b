"""A batch compiled to Kronecker blocks is priced by what the implicit path works on (its
answers, marginals and blocks: :mod:`dpsql.mechanisms.implicit_cost`), not by the dense
product's candidates, and refused before any charge only when that prediction is over
``max_memory`` or ``time_limit`` (issue 22 item 3)."""

from __future__ import annotations

import math

import pytest

import dpsql
from dpsql.errors import BatchTooLarge
from dpsql.mechanisms import fit, implicit_cost, selection
from dpsql.sql.compile import compile_workload
from dpsql.sql.implicit import compile_batch
from dpsql.workload import limits as planning

CUBE = ("SELECT age, sex, race, income, COUNT(*) FROM adult "
        "GROUP BY CUBE(age, sex, race, income)")


def _forms(db):
    """(the implicit form the request uses, the dense form of the same batch, candidates)."""
    policies = db.policies()
    policy, queries, _ = db._compile(CUBE, policies)
    implicit = compile_batch(queries, policy)
    assert getattr(implicit, "implicit", False), "the CUBE should compile to blocks"
    return implicit, compile_workload(queries, policy), selection.requested(policy, 1e-6,
                                                                            "auto")


def test_the_implicit_prediction_comes_from_its_own_sizes(db):
    """The request's prediction is the implicit formula on its answers, marginals and blocks:
    a few seconds at most for ~4,000 cells, where the dense candidates' model (cubic in the
    cells) predicts more than ten times as much."""
    implicit, dense, names = _forms(db)
    cost = fit.request_cost(implicit, names)
    f = implicit_cost.features(implicit)
    assert f[1] == implicit.n_queries and f[2] == implicit_cost.cells(implicit)
    assert cost.seconds == pytest.approx(sum(c * x for c, x in zip(
        implicit_cost.IMPLICIT_TIME_FIT, f)))
    assert cost.memory == implicit_cost.predicted_bytes(implicit) + \
        implicit_cost.OVERHEAD_BYTES
    assert cost.seconds < 5.0, cost
    assert 10 * cost.seconds < fit.request_cost(dense, names).seconds


def test_not_refused_at_a_modest_time_limit(db):
    """A limit under the dense model's prediction of the same batch, but twice the
    implicit one: explain plans it, answer releases it."""
    implicit, dense, names = _forms(db)
    limit = 2 * fit.request_cost(implicit, names).seconds
    assert fit.request_cost(dense, names).seconds > limit
    with dpsql.planning_limits(time_limit=limit):
        assert db.explain(CUBE, epsilon=1, delta=1e-6).strategy in ("residual", "marginals")
        db.answer(CUBE, epsilon=1, delta=1e-6)
    assert len(db.ledger()) == 1


@pytest.mark.parametrize("limit", ["time_limit", "max_memory"])
def test_refused_when_over_the_limit_nothing_charged(db, limit):
    """Just under the implicit prediction (time or memory): refused in one line naming the
    limit, before any charge; just over it, the same request is answered."""
    implicit, _, names = _forms(db)
    cost = fit.request_cost(implicit, names)
    need = cost.seconds if limit == "time_limit" else cost.memory
    under = {limit: need * 0.9 if limit == "time_limit" else math.floor(need * 0.9)}
    with dpsql.planning_limits(**under):
        with pytest.raises(BatchTooLarge, match=limit) as info:
            db.answer(CUBE, epsilon=1, delta=1e-6)
    text = str(info.value)
    assert "nothing was charged" in text and "\n" not in text and "split the batch" in text
    assert db.ledger() == []
    over = {limit: need * 1.1 if limit == "time_limit" else math.ceil(need * 1.1)}
    with dpsql.planning_limits(**over):
        db.answer(CUBE, epsilon=1, delta=1e-6)
    assert len(db.ledger()) == 1


def test_the_bound_flops_are_those_bound_total_checks(db):
    """The cost's bound term is the bound's own flop count (skipped bounds cost nothing)."""
    implicit, _, _ = _forms(db)
    flops = implicit_cost.bound_flops(implicit)
    assert math.isfinite(flops) and flops > 0
    assert implicit_cost.bound_skipped(implicit) is None
    assert implicit_cost.features(implicit)[4] == flops
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(implicit_cost, "MAX_BOUND_FLOPS", flops / 2)
        assert implicit_cost.bound_skipped(implicit) == flops
        assert implicit_cost.features(implicit)[4] == 0.0
    assert planning.current().time_limit == planning.DEFAULT_TIME_LIMIT
