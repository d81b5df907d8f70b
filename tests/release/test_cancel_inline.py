"""Which steps fork (:func:`dpsql.cancel.long_step`), and a token cancel inside an inline
solve: a request alone in its process computes a step predicted under
``LONG_STEP_ALONE`` inline (forking would cost a fifth of it), so the solver itself must
let a token land between its iterations."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import scipy.sparse as sp

from dpsql import cancel
from dpsql.errors import RequestCancelled
from dpsql.strategies.gaussian import dual, optimal
from dpsql.workload.matrix import WorkloadInfo


def test_alone_a_step_under_a_second_runs_inline_and_nested_scopes_count_once():
    assert cancel.long_step() == cancel.LONG_STEP_ALONE
    with cancel.scope(cancel.Token()):
        with cancel.scope(cancel.Token()):          # Session._request nests two
            assert cancel.long_step() == cancel.LONG_STEP_ALONE
            assert cancel.run(os.getpid, seconds=0.9 * cancel.LONG_STEP_ALONE) == os.getpid()
            assert cancel.run(os.getpid, seconds=1.1 * cancel.LONG_STEP_ALONE) != os.getpid()
    assert cancel.long_step() == cancel.LONG_STEP_ALONE


def test_with_another_request_planning_a_step_over_long_step_forks():
    """A second request planning in another thread (the server's other connection): LAPACK
    would hold the GIL, so a step over LONG_STEP runs in a worker again."""
    inside, leave = threading.Event(), threading.Event()

    def other_request():
        with cancel.scope(cancel.Token()):
            inside.set()
            leave.wait(30)

    other = threading.Thread(target=other_request)
    other.start()
    try:
        assert inside.wait(30)
        with cancel.scope(cancel.Token()):
            assert cancel.long_step() == cancel.LONG_STEP
            seconds = (cancel.LONG_STEP + cancel.LONG_STEP_ALONE) / 2
            assert cancel.run(os.getpid, seconds=seconds) != os.getpid()
    finally:
        leave.set()
        other.join(30)
    assert cancel.long_step() == cancel.LONG_STEP_ALONE


def points_and_ranges(n: int = 96, k: int = 140) -> WorkloadInfo:
    rng = np.random.default_rng(3)
    ends = np.sort(rng.integers(0, n, size=(k, 2)), axis=1)
    rows = [np.arange(a, b + 1) for a, b in ends]
    R = sp.csr_matrix((np.ones(sum(r.size for r in rows)), np.concatenate(rows),
                       np.cumsum([0] + [r.size for r in rows])), shape=(k, n))
    return WorkloadInfo.from_matrix(sp.vstack([sp.identity(n, format="csr"), R]).tocsr(), (n,))


@pytest.mark.parametrize("symmetry", [False, True])
def test_a_token_lands_between_the_solvers_iterations(monkeypatch, symmetry):
    """The token is cancelled during the first evaluation: the solver stops at its next
    iteration (RequestCancelled), never finishing; without a cancel it finishes."""
    info = points_and_ranges()
    assert optimal.solve(info, symmetry=symmetry).gap <= optimal.TOL
    token, evaluations = cancel.Token(), []
    real = dual.FullForm.evaluate

    def evaluate(self, w, single=False, tol=0.0):
        evaluations.append(single)
        token.cancel("stopped by the test")
        return real(self, w, single, tol)

    monkeypatch.setattr(dual.FullForm, "evaluate", evaluate)
    with cancel.scope(token), pytest.raises(RequestCancelled, match="stopped by the test"):
        optimal.solve(info, symmetry=symmetry)
    assert len(evaluations) == 1


def test_a_token_lands_inside_the_low_rank_ascent(monkeypatch):
    """A low-rank workload's L-BFGS ascent (FactoredForm) checks the token per evaluation:
    cancelled during its first evaluation, it never reaches the fixed point."""
    rng = np.random.default_rng(5)
    W = sp.csr_matrix(rng.integers(0, 2, size=(6, 80)).astype(float))
    info = WorkloadInfo.from_matrix(W, (80,))
    token, parts = cancel.Token(), []
    real = dual.FactoredForm._parts

    def spy(self, w):
        parts.append(1)
        token.cancel("stopped by the test")
        return real(self, w)

    def fixed_point(*args, **kwargs):
        raise AssertionError("the ascent ran to its end: no check inside it")

    monkeypatch.setattr(dual.FactoredForm, "_parts", spy)
    monkeypatch.setattr(optimal, "_ascend", fixed_point)
    with cancel.scope(token), pytest.raises(RequestCancelled, match="stopped by the test"):
        optimal.solve(info)
    assert parts
