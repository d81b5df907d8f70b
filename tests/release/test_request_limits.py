"""``time_limit`` bounds the whole request (planning, the kernel, inference and the write),
not each step: candidates are admitted cheapest first while the request's predicted total
fits (issue 22 item 3, :func:`dpsql.mechanisms.fit.screen`)."""

from __future__ import annotations

import pytest

import dpsql
from dpsql.errors import BatchTooLarge
from dpsql.mechanisms import fit, selection
from dpsql.workload import limits as planning

WIDE = "SELECT race, sex, income, COUNT(*) FROM adult GROUP BY CUBE(race, sex, income)"


def _sizes(db):
    policy, _, workload = db._compile(WIDE, db.policies())
    names = selection.requested(policy, 1e-6, "auto")
    costs = sorted(fit.candidate_seconds(workload, f, n, s) for f, n, s in names)
    fixed = (fit.release(workload).seconds
             + planning.bound_cost(workload.n_cells, workload.n_queries, workload.W.nnz,
                                   planning.gram_ops(workload.W)).seconds)
    return workload, names, costs, fixed


def test_time_limit_is_the_requests_total(db):
    """A limit every candidate fits on its own (with the release and the bound), but not
    all together. Passing: the cheapest are kept while their sum fits, the others skipped
    "in total", the request's predicted total within the limit, and explain says so
    without refusing."""
    workload, names, costs, fixed = _sizes(db)
    limit = fixed + costs[-1]
    fits = max(k for k in range(len(costs) + 1) if fixed + sum(costs[:k]) <= limit)
    assert 0 < fits < len(costs), (costs, fixed)
    with dpsql.planning_limits(time_limit=limit):
        kept, skipped = fit.screen(workload, names, True)
        assert len(kept) == fits, (kept, costs)
        assert skipped and all("in total" in e.note for e in skipped), skipped
        assert fit.request_cost(workload, names).seconds <= limit
        expl = db.explain(WIDE, epsilon=1, delta=1e-6)
    notes = [c.note for c in expl.candidates if "skipped" in c.note]
    assert len(notes) == len(skipped) and all("in total" in n for n in notes)


def test_a_release_alone_over_the_time_limit_is_refused(db):
    """Below the release's own predicted time nothing fits: refused in one line, nothing
    charged."""
    workload, _, _, _ = _sizes(db)
    limit = fit.release(workload).seconds / 2
    with dpsql.planning_limits(time_limit=limit):
        with pytest.raises(BatchTooLarge, match="time_limit") as info:
            db.answer(WIDE, epsilon=1, delta=1e-6)
    assert "nothing was charged" in str(info.value) and "\n" not in str(info.value)
    assert db.ledger() == []
