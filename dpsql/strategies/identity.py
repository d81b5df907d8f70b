"""``identity``: measure every cell once (``A = I``).

Privacy: one row changes one cell count by 1, so every column of ``I`` has L2 norm 1: the
sensitivity is 1 and ``y = x + N(0, σ²I)`` with σ calibrated for Δ = 1 is (ε, δ)-DP
(Gaussian mechanism). The answers ``W y`` are post-processing. Error per query:
``σ² ||W_i||²`` (Li & Miklau, Eigen-Design §2, with ``A = I``).
"""

from __future__ import annotations

from dpsql.workload.matrix import Plan, WorkloadInfo


class IdentityStrategy:
    name = "identity"

    def plan(self, workload: WorkloadInfo) -> Plan:
        return Plan("identity", workload.n, None, 1.0, integral=True, l1_sensitivity=1.0)
