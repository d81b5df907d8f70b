"""MWEM's worst-case guarantee (Hardt, Ligett & McSherry, Theorem 2.3). Public only."""

from __future__ import annotations

import math
import numbers

from dpsql.errors import PrivacyParameterError, StrategyError
from dpsql.noise.accounting import to_exact


def mwem_error_bound(n_total, n_cells, n_queries, rounds, epsilon, beta=0.05) -> float:
    """Theorem 2.3's bound on MWEM's maximum query error, holding with probability ≥ 1 − β.

    Hardt, Ligett & McSherry, Theorem 2.3 (proof in their Appendix A): for any data set of
    ``N`` records over a universe ``D``, any set ``Q`` of linear queries with values in
    [0, 1], any ``T`` and ``ε > 0``, with probability at least ``1 − 2T/|Q|`` the average
    ``A = avg_{i≤T} Aᵢ`` output by MWEM satisfies

        ``max_{q∈Q} |q(A) − q(B)| ≤ 2N √(log|D| / T) + 10 T log|Q| / ε``   (natural logs).

    The proof's two slack terms come from Lemma A.1: the exponential mechanism at
    ``ε/(2T)`` picks a query within ``4T ln(2T|Q|/β)/ε`` of the worst one, and each Laplace
    measurement is within ``2T ln(2T/β)/ε``, each with probability ≥ 1 − β/(2T) per
    round. We return the bound for any ``β``::

        2N √(ln|D| / T) + (4T ln(2T|Q|/β) + 2T ln(2T/β)) / ε

    which equals the theorem's expression exactly at ``β = 2T/|Q|``. ``n_cells`` is ``|D|``,
    or the list of block sizes for the factored form (``|D| = Π n_g``, the product domain).
    ``epsilon`` is the budget of the rounds (excluding any share spent on ``N`` or on an
    initial histogram). The theorem covers the plain algorithm (single-query selection,
    uniform start, exact ``N``, averaged output); replay, cuboids and the last iterate are
    heuristics outside it. It is a worst case: MWEM's actual error is data-dependent and
    usually much smaller.
    """
    sizes = [n_cells] if isinstance(n_cells, numbers.Integral) else list(n_cells)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1
                        for s in sizes):
        raise StrategyError(f"n_cells must be an integer >= 1 or a list of them, "
                            f"got {n_cells!r}")
    log_domain = sum(math.log(int(s)) for s in sizes)
    for name, value in (("n_queries", n_queries), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise StrategyError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(n_total, bool) or not isinstance(n_total, numbers.Real) \
            or not math.isfinite(n_total) or n_total < 0:
        raise StrategyError(f"n_total must be a finite number >= 0, got {n_total!r}")
    eps = float(to_exact(epsilon, "epsilon"))
    if not eps > 0:
        raise PrivacyParameterError(f"epsilon must be > 0, got {epsilon!r}")
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 < beta < 1:
        raise StrategyError(f"beta must be a failure probability in (0, 1), got {beta!r}")
    T, Q = int(rounds), int(n_queries)
    mw_term = 2.0 * float(n_total) * math.sqrt(log_domain / T)
    noise_term = (4 * T * math.log(2 * T * Q / beta) + 2 * T * math.log(2 * T / beta)) / eps
    return mw_term + noise_term
