"""MWEM's default rounds, replay and measurement, from the workload and ε alone (issue 21).

An analyst who asks for ``strategy="mwem"`` gets these; nothing here looks at the data or
at any error. The rule was fitted on synthetic data only (``benchmarks/mwem_defaults.py``:
1-D zero-inflated and smooth columns of 1,000–4,000 cells with 1,000 random ranges, a 2-D
60 x 80 ridge with 1,000 random rectangles, N ∈ {10⁴, 5·10⁴}, ε ∈ {0.01, 0.05, 0.1, 0.5};
results in ``benchmarks/results/mwem_defaults.txt``) and committed before MWEM's Adult
benchmark was run with it.

**Rounds.** Theorem 2.3's two terms, ``2N √(ln|D|/T)`` (MW has not converged) and
``~T ln|Q| / ε`` (each round's noise), balance at ``T ∝ (ε N)^{2/3}`` up to logarithms: the
best T grows with the signal-to-noise ratio ``ε N`` (rows per unit of noise scale). The
study confirms the shape with a smaller exponent (the theorem is a worst case; replay and
the last iterate converge faster): the best T in hindsight on the synthetic grid is fitted by

    T_block = clamp(round(C · (ε_R · N / K)^A), T_MIN, T_MAX),   T = K · T_block

with ``ε_R`` the rounds' budget, ``N`` the row count (public, or the run's own noisy
estimate — post-processing of a released value), ``K`` the number of blocks that get
rounds (each block sees ``ε_R N / K``; the split over blocks is an extrapolation: the study
had one block). Fit (``benchmarks/mwem_defaults.py --part fit``): over the 32
configurations with partition measurement, the (C, A) on a grid minimising the mean of
log(MSE at the rule's T / the smallest MSE over T ∈ {2, 3, 5, 8, 12, 20, 30}), MSE
interpolated in log T: ``C = 0.47, A = 0.38``, geometric mean ratio 1.16 to the best grid T
chosen in hindsight; worst 2.3 (ε N = 100, where the MSE curve is flat and noisy). The
exponent is below the theorem's 2/3: replay and the last iterate converge faster than the
worst case.

**Replay.** ``REPLAY = 100`` extra MW passes over past measurements per round: an earlier
synthetic study (no Adult; 1-D spiky and smooth data and a 2-D ridge, 1,000 random ranges or
rectangles, ε 0.05–0.5; ``benchmarks/mwem_adult.py``'s docstring) found 100, 300 and 1000
within noise of each other and all up to 1.5x better than 10; 100 is the cheapest of them.

**Measurement.** ``measure="partition"``: a selected box (range, rectangle) is measured with
the boxes around it in the same Laplace step at the same ε (L1 sensitivity 1, see
:func:`dpsql.mechanisms.mwem.state.box_partition`): more information for the same budget. In
the study (1-D spike data, n = 1000, both N, all four ε) its best MSE over T was below
single-query measurement's best in all 8 configurations, by 1.1x–2.8x
(``benchmarks/results/mwem_defaults.txt``); the rest of the study ran partition only.

**N.** When the policy does not declare the row count, ``TOTAL_SHARE`` of ε estimates it
(Laplace on the all-ones row). Its error biases every answer by ``q·p · (N̂ − N)``, a term
``∝ 1/(s ε)²`` against the rounds' error growing as ``s`` takes budget from them. The study's
share table (default options, 4 runs, the two 1-D spike data sets at both N and all four ε;
the run was stopped there for time) compares s ∈ {1/40, 1/20, 1/10, 1/5}: not knowing N costs
0.4x–1.7x the MSE with N public (noise-dominated), no share is better than 1/20 consistently,
1/5 is worst in most rows; so the share stays 1/20.
"""

from __future__ import annotations

from fractions import Fraction

#: the fitted rule T_block = C · (ε_R N / K)^A (see the module docstring)
RULE_C, RULE_A = 0.47, 0.38
#: the rule's range of rounds per block
T_MIN, T_MAX = 2, 40
#: extra MW passes over past measurements per round
REPLAY = 100
#: share of ε spent estimating N when the policy does not declare it
TOTAL_SHARE = Fraction(1, 20)


def default_rounds(epsilon_rounds, total: float, blocks: int = 1) -> int:
    """``T`` for a run whose rounds get ``epsilon_rounds`` over ``blocks`` blocks and whose
    row count is ``total`` (public or the noisy estimate, floored at 1)."""
    k = max(1, int(blocks))
    signal = float(epsilon_rounds) * max(float(total), 1.0) / k
    per_block = RULE_C * signal ** RULE_A if signal > 0 else T_MIN
    return k * int(min(T_MAX, max(T_MIN, round(per_block))))


def max_rounds(blocks: int = 1) -> int:
    """The most rounds the rule can choose (what the checks before the charge assume)."""
    return max(1, int(blocks)) * T_MAX


def describe(epsilon_rounds, total: float, blocks: int, T: int) -> str:
    signal = float(epsilon_rounds) * max(float(total), 1.0) / max(1, blocks)
    return (f"T = {T} by the default rule: {blocks} x clamp(round({RULE_C} x (ε_R·N/K = "
            f"{signal:.4g})^{RULE_A}), {T_MIN}, {T_MAX}) (fitted on synthetic data, "
            f"dpsql.mechanisms.mwem.defaults)")


__all__ = ["REPLAY", "RULE_A", "RULE_C", "TOTAL_SHARE", "T_MAX", "T_MIN", "default_rounds",
           "describe", "max_rounds"]
