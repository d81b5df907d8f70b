"""Projected Newton ascent of the low-rank dual (:class:`~dpsql.strategies.gaussian.dual.
FactoredForm`): the first phase of ``optimal`` on a rank-deficient ``V = F Fᵀ``.

The program is ``max Φ(v) = 2 h(v) − Σ_j v_j`` over ``v >= 0`` (concave; its maximum is
``h*²`` at ``h*² w*``), with ``h(v) = tr(K^½)``, ``K = Fᵀ diag(v) F`` and gradient ``a − 1``,
``a_j = f_jᵀ K^-½ f_j``. Many optimal weights are 0 when ``r`` is well below ``n``, which is
why the multiplicative fixed point crawls there; L-BFGS-B reaches them but needed 75-106
evaluations (11-24 s of CPU at load 3-4) on 600-1,024 random ranges over 1,024 cells, where
these steps take 11-12 (2.4-5.2 s, quiet or loaded).

The Hessian is again a Daleckii–Krein sum. With ``K = P diag(μ) Pᵀ``, ``ρ = √μ`` and ``G =
F P``, the divided difference of ``s^-½`` at ``μ_k, μ_l`` is ``−1/(ρ_k ρ_l (ρ_k + ρ_l))``, so

    ∂a_j/∂v_m = −Σ_kl G_jk G_mk G_jl G_ml / (ρ_k ρ_l (ρ_k + ρ_l)) = −[∫ F_t ∘ F_t dt]_jm,
    F_t = G diag(e^{−tρ}/ρ) Gᵀ,

a negative semidefinite matrix (Schur products of PSD matrices), integrated on the nodes of
:func:`dpsql.strategies.gaussian.newton.nodes` (one symmetric rank-``r`` product each, in
float32: a few percent of error, which slows the ascent and never moves a bound). Each step
(Bertsekas, *Projected Newton methods for optimization problems with simple constraints*,
SIAM J. Control Optim. 20(2), 1982, §2): the weights at 0 whose gradient points outward are
held there, Newton's direction ``(−H_FF)⁻¹ g_F`` moves the others, and a projected Armijo
search ``v ← max(v + α d, 0)`` keeps ``Φ`` increasing.

It stops as soon as its own iterate certifies the caller's gap (:class:`~dpsql.strategies.
gaussian.dual.Certificate`: ``X(w)/max x`` against the largest ``low²/Σv`` seen), or after
its step budget, and hands ``w = v/Σv`` on; the caller's float64 evaluation then certifies
(or L-BFGS-B, up to its rank limit, and the fixed point finish). A poor Hessian costs steps,
never the certificate.
Pure numerics on the public workload.
"""

from __future__ import annotations


import numpy as np
import scipy.linalg as la

from dpsql import cancel
from dpsql.strategies.gaussian.dual import Certificate
from dpsql.strategies.gaussian.newton import schur_sum

#: Newton steps at most (each one Hessian and one or a few evaluations)
STEPS = 40
#: cells up to which the n x n Hessian (12 bytes a pair: 50 MB at 2,048) is always formed;
#: above, only where the rank is at least :data:`RANK_SHARE` of the cells (its ``n² r`` a
#: step then costs about what L-BFGS-B's four or five times as many evaluations, ``n r² +
#: r³`` each, would) and up to :data:`MAX_CELLS` (805 MB at 8,192, as much as the dense
#: path's own matrices). Elsewhere (few queries over many cells) the caller's L-BFGS-B
#: (O(n r) memory) ascends alone. At 2,048 cells and rank 1,441 (over the rank up to which
#: L-BFGS-B is tried) the fixed point alone had stalled at a gap of 4.6e-6 after 49 s; these
#: steps certify in 11 evaluations, 12-14 s
HESSIAN_CELLS, RANK_SHARE, MAX_CELLS = 2048, 0.25, 8192
#: Armijo's sufficient-increase fraction and the largest number of halvings per step
ARMIJO, HALVINGS = 1e-4, 8
#: weights at or below this fraction of the largest whose gradient points outward form the
#: active set (Bertsekas's ε-active set): they are set to 0, the Newton step moves the rest
ZERO = 1e-3
#: a step keeps at least this fraction of every weight, coordinate by coordinate (near 0
#: ``h`` curves like a square root and the Hessian of the far side is no guide: zeroing 42
#: weights in the first step blew ``max a`` up to 1e8); a weight bound for 0 gets there in
#: a few steps, then joins the active set
KEEP = 1e-2
#: ``−H`` is nearly singular (cells whose ``f_j`` nearly coincide): Marquardt's damping,
#: this fraction of each diagonal entry and of the largest, keeps it definite (its float32
#: entries err by ~1e-7 of the largest)
DAMPING = 1e-5


def forms_hessian(cells: int, rank: int) -> bool:
    """Whether these steps run (their n x n Hessian is formed) on a factored dual of
    ``rank`` over ``cells``: see :data:`HESSIAN_CELLS`."""
    return cells <= HESSIAN_CELLS or RANK_SHARE * cells <= rank and cells <= MAX_CELLS


def negative_hessian(G: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """``−∂a/∂v`` (float32, upper triangle, n x n) from ``G = F P`` and ``ρ = √μ``: the
    kernel ``1/(ρ_k ρ_l (ρ_k + ρ_l))`` of the module doc, by
    :func:`~dpsql.strategies.gaussian.newton.schur_sum`."""
    return schur_sum(G, rho, -1.0)


def ascend(form, w: np.ndarray, gap: float, max_evaluations: int) -> tuple[np.ndarray, int,
                                                                          bool]:
    """Projected Newton from ``w`` (on the simplex) until its iterate certifies ``gap``:
    ``(w, evaluations, certified)``; ``w`` is the best iterate (largest ``Φ``) when not.
    Where the Hessian is not formed (:func:`forms_hessian`) it does nothing: ``(w, 0,
    False)``."""
    if not forms_hessian(w.size, form.r):
        return w, 0, False
    state, certificate = {"calls": 0}, Certificate(gap)

    def evaluate(v, parts=None):
        cancel.check()                       # inline (a short solve), a token lands here
        state["calls"] += 1
        rho, low, G, a = form._parts(v) if parts is None else parts
        done = certificate.holds(v, rho, low, a)
        return 2 * float(rho.sum()) - float(v.sum()), rho, G, a, done

    # the best point on the ray through w is v = h(w)² w, where (K scaling by h²) ρ and
    # low scale by h, a by 1/h and G stays: no second evaluation
    rho, low, G, a = form._parts(w)
    h = float(rho.sum())
    v = w * h * h
    value, rho, G, a, done = evaluate(v, (rho * h, low * h, G, a / h))
    for _ in range(STEPS):
        if done or state["calls"] >= max_evaluations:
            break
        g = a - 1
        free = (v > ZERO * v.max()) | (g > 0)
        step = _direction(G[free], rho, g[free])
        if step is None:
            break
        d = np.zeros_like(v)
        d[free] = step
        d[~free] = -v[~free]                     # the active weights go to 0 at once
        moved = _search(evaluate, v, value, g, d, max_evaluations - state["calls"])
        if moved is None:
            break
        v, (value, rho, G, a, done) = moved
    return v / v.sum(), state["calls"], done


def _direction(G: np.ndarray, rho: np.ndarray, g: np.ndarray) -> np.ndarray | None:
    """Newton's ``(−H)⁻¹ g`` on the free weights, or None when the damped ``−H`` is not
    positive definite (the caller's other ascents take over)."""
    if g.size == 0:
        return None
    M = np.asfortranarray(negative_hessian(G, rho), dtype=float)
    diagonal = np.einsum("ii->i", M)             # a view: Marquardt's damping in place
    diagonal += DAMPING * diagonal + DAMPING * float(diagonal.max())
    # solved in float64: a float32 solve stalled the steps at a gap of ~5e-7
    factor, info = la.lapack.dpotrf(M, lower=0, overwrite_a=1)
    if info != 0 or not np.all(np.isfinite(np.diag(factor))):
        return None
    d, info = la.lapack.dpotrs(factor, g, lower=0)
    d = np.asarray(d, dtype=float)
    return d if info == 0 and np.all(np.isfinite(d)) else None


def _search(evaluate, v, value, g, d, budget: int):
    """Projected Armijo search: the first ``α = 2^-i`` with ``Φ(moved) >= Φ(v) + ARMIJO ·
    gᵀ(moved − v)``, ``moved = max(v + α d, KEEP · v)``, or whose ``moved`` certifies the
    gap; ``(moved, its evaluation)`` or None. (Near the optimum ``Φ`` is flat to its
    rounding: a full step that certified failed Armijo's test on rounding alone, the halved
    ones moved away, and L-BFGS-B then stalled for 60 evaluations.)"""
    alpha = 1.0
    for _ in range(min(HALVINGS, budget)):
        moved = np.maximum(v + alpha * d, KEEP * v)
        moved[d == -v] = v[d == -v] * (1 - alpha)            # the active set: toward 0
        if moved.sum() > 0:
            found = evaluate(moved)
            if found[4] or found[0] >= value + ARMIJO * float(g @ (moved - v)):
                return moved, found
        alpha /= 2
    return None
