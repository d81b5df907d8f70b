"""``workload``: measure the queries themselves (``A = W``).

Privacy: ``y = W x + N(0, σ²I)`` with σ calibrated to the L2 sensitivity of ``W`` (its
largest column norm: the number of queries one cell appears in, square-rooted, for 0/1
rows) is (ε, δ)-DP by the Gaussian mechanism. Least squares ``x̂ = W⁺ y`` projects ``y`` onto
the column space of ``W`` (post-processing), which can only lower the error of consistent
answers: ``W x̂ = U Uᵀ y`` with error covariance ``σ² U Uᵀ`` (Eigen-Design §2, ``A = W``).
"""

from __future__ import annotations

import scipy.sparse as sp

from dpsql.errors import StrategyError
from dpsql.workload.matrix import Plan, WorkloadInfo, l2_sensitivity, make_plan


class WorkloadStrategy:
    name = "workload"

    def plan(self, workload: WorkloadInfo) -> Plan:
        W = workload.W
        if W is None:
            raise StrategyError("the workload strategy needs the workload's rows")
        sens = l2_sensitivity(W)
        if sens == 0:
            raise StrategyError(
                "the workload strategy cannot measure a batch whose queries select no cell "
                "(every answer is 0 whatever the data); use strategy='identity'")
        return make_plan("workload", sp.csr_matrix(W, dtype=float))
