"""Non-negative, consistent answers for batches compiled to Kronecker blocks (issue 16): a
graphical-model estimate in the manner of Private-PGM, over the local polytope.

Private-PGM (McKenna, Sheldon, Miklau, "Graphical-model based estimation and inference for
differential privacy", ICML 2019, §3) estimates the data's marginals ``μ`` on a set of
cliques as ``argmin_{μ ∈ M} L(μ)`` for a convex loss ``L`` of the marginals, over the
marginal polytope ``M``, and answers the queries from ``μ``. On dense sets of cliques (every
pair of ten columns) ``M`` needs a junction tree over nearly the whole product, so McKenna,
Pradeep, Sheldon, Miklau ("Relaxed Marginal Consistency for Differentially Private Query
Answering", NeurIPS 2021, §3) optimise over the local polytope instead:

    𝓛 = {μ_R ≥ 0 for each region R; the marginals of μ_R and μ_R' agree on R ∩ R'},

the regions being the maximal sets among the blocks' columns. 𝓛 ⊇ M, with equality when
the regions form a junction tree.

**The loss** (:func:`estimate`) is ``L(μ) = ½ Σ_k ‖s_k (⊗_i F_{k,i}) μ_{C_k} − y_k‖²`` for
linear measurements of the marginals. dpsql uses the batch's own blocks with ``y`` their
least-squares answers (:func:`block_measurements`): the estimate is the projection of the
least-squares answers onto the answers of 𝓛 in the workload's (semi)norm ``‖W·‖``. The true
marginals lie in 𝓛, and a projection onto a convex set is firmly non-expansive, so for any
data ``‖W(μ̂ − μ)‖² ≤ ‖W(μ̂_LS − μ)‖² − ‖W(μ̂_LS − μ̂)‖²``: the blocks' total squared error is
never above the least-squares answers'. (The measurements' own likelihood, the paper's
choice, gives no such guarantee in the workload's metric, and on Adult's ten-column pairs it
raised the RMSE by 12–29%.)

**The consistent subspace V** (signed locally consistent tables). With one orthonormal basis
per column, ``Q_i = [1ᵀ/√n_i; H_i]`` (``H_i`` the Helmert rows), a family ``(μ_R)`` is
consistent exactly when ``μ_R = Σ_{S⊆R} p_{R,S}^{-1/2} (⊗_{i∈S} H_iᵀ ⊗_{i∈R∖S} 1/√n_i) c_S``
with one tensor ``c_S`` per set S shared by every region that holds S (``p_{R,S} = Π_{i∈R∖S}
n_i``): summing a region down to T ⊆ R kills every S ⊄ T (``H_i 1 = 0``) and turns the scale
of S ⊆ T into ``p_{T,S}^{-1/2}``, whichever region it came from; conversely, agreement on the
intersections fixes each ``c_S``. The Euclidean projection onto V is then closed form: in
each region's ``⊗Q_i`` coordinates the S-slice is ``e_{R,S}``, and the projection sets
``c_S = Σ_{R⊇S} e_{R,S} p_{R,S}^{-1/2} / Σ_{R⊇S} p_{R,S}^{-1}`` (:mod:`dpsql.inference.consistent`).

**Davis–Yin three-operator splitting** (Davis & Yin, "A three-operator splitting scheme and
its optimization applications", Set-Valued Var. Anal. 2017, Algorithm 1) on
``L + ι_V + ι_{≥0}`` in the metric ``M = Σ_R β_R ‖μ_R‖²``: ``x_V = P_V^M(z)``,
``x₊ = max(2x_V − z − M⁻¹∇L(x_V), 0)``, ``z ← z + x₊ − x_V``. Each measurement is read
through one home region (the smallest holding it), so ∇L is block diagonal over the regions
and ``β_R`` ≥ its Lipschitz constant on R makes ``M⁻¹∇L`` 1-Lipschitz in ``M`` (step 1 < 2,
as the scheme needs; β_R: 1.25 × a power-iteration estimate, capped by
``Σ_k s_k² Π‖F_{k,i}‖₂² p_{R,C_k}``). A diagonal M keeps the non-negativity projection a
clip, and the projection onto V stays closed form with ``β_R`` in both sums. On V every
region gives the same marginal, so the choice of homes changes ∇L only by a vector
orthogonal to V, not the minimisers. The start is the least-squares marginals when the
caller has them (then a feasible least-squares optimum is returned at once), else a
conjugate-gradient least-squares solve in V. The rounds stop when
``‖x₊ − x_V‖ ≤ TOLERANCE · ‖x_V‖`` or at the request's bound; ``x₊`` (non-negative) is
returned.

Privacy: a function of the released answers and of public inputs only (post-processing);
it reads no data and spends nothing.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpsql.inference.consistent import Subspace
from dpsql.inference.union_kron import home   # the smallest region holding the columns
from dpsql.workload.marginals import MarginalMeasurement

#: stop when ‖x₊ − x_V‖ ≤ TOLERANCE · max(‖x_V‖, 1) (x₊ is then consistent to that level)
TOLERANCE = 1e-4
#: at most this many rounds (the request affords fewer when its limits say so)
MAX_ROUNDS = 3000
#: the fewest rounds a request must be able to afford: below this the estimate is refused
#: before the charge (the batch is too wide for the post-processing within time_limit)
MIN_ROUNDS = 100
#: seconds per numpy call and per region cell and axis of one round (fitted on the Adult
#: ten-column pairs and 1-, 2- and 3-way marginals, 45 and 120 regions, 14 and 84 ms a round
#: on one loaded core, 2026-11-29; rounded up); general factors (ranges) add their flops
CALL_SECONDS, CELL_AXIS_SECONDS = 2e-5, 3e-8
#: at most this many conjugate-gradient rounds for the least-squares start
CG_ROUNDS = 100
#: bytes per region cell while estimating (z, x_V, x₊, ∇L, the transforms' temporaries)
BYTES_PER_CELL = 8 * 10


def block_measurements(blocks) -> list:
    """The blocks as measurements of their marginals: ``√w (⊗_{i∈B} F_i)`` on B = ``used``."""
    return [MarginalMeasurement(b.used, tuple(b.factors[i] for i in b.used),
                                math.sqrt(b.weight)) for b in blocks]


def regions_of(cliques) -> tuple:
    """The maximal sets among ``cliques`` (sorted column tuples), in a fixed order."""
    sets = {tuple(sorted(int(c) for c in C)) for C in cliques}
    return tuple(sorted((C for C in sets if not any(set(C) < set(D) for D in sets)),
                        key=lambda C: (-len(C), C)))


def round_seconds(sizes, measurements) -> float:
    """The predicted seconds of one round (public: sizes and factors only): the numpy calls
    of the projection and the measurements, the cells they sweep, and the flops of the
    factors applied as matrix products (:class:`_Factor`)."""
    from dpsql.workload import limits as planning

    sizes = tuple(int(n) for n in sizes)
    regions = regions_of([m.columns for m in measurements])
    calls = sum(2 ** (len(R) + 1) + 4 * len(R) for R in regions)
    cells = sum(math.prod(sizes[i] for i in R) * max(len(R), 1) for R in regions)
    flops = 0.0
    for m in measurements:
        calls += 4 * len(m.columns) + 4
        inside = math.prod(sizes[i] for i in m.columns)
        for F in m.factors:
            if _Factor(F).index is None:
                flops += 4.0 * F.shape[0] * inside
    return CALL_SECONDS * calls + CELL_AXIS_SECONDS * cells + flops / planning.FLOPS


def planned_rounds(sizes, measurements, limits) -> tuple[int, str | None]:
    """(the most rounds the request affords, or why the estimate cannot run) from public
    sizes: the rounds that fit in ``limits.time_limit``, at most :data:`MAX_ROUNDS`; refused
    under :data:`MIN_ROUNDS` or over ``limits.max_memory``."""
    from dpsql.workload import limits as planning

    sizes = tuple(int(n) for n in sizes)
    regions = regions_of([m.columns for m in measurements])
    cells = sum(math.prod(sizes[i] for i in R) for R in regions)
    per_round = round_seconds(sizes, measurements)
    rounds = min(MAX_ROUNDS, int(limits.time_limit / max(per_round, 1e-12)))
    if cells * BYTES_PER_CELL > limits.max_memory:
        return 0, (f"needs about {planning.show_bytes(cells * BYTES_PER_CELL)} for its "
                   f"{cells:,} marginal cells, over max_memory = "
                   f"{planning.show_bytes(limits.max_memory)}")
    if rounds < MIN_ROUNDS:
        return 0, (f"needs about {MIN_ROUNDS * per_round:.3g} s for {MIN_ROUNDS} rounds "
                   f"over its {cells:,} marginal cells, over time_limit = "
                   f"{limits.time_limit:g} s")
    return rounds, None


def _mode(T: np.ndarray, F: np.ndarray, axis: int) -> np.ndarray:
    """``T ×_axis F`` as one batched matrix product (:func:`~dpsql.workload.blocks.
    apply_along` without its transposes: this runs thousands of times per estimate)."""
    shape = T.shape
    pre, post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    if post == 1:                                  # the last axis: one product
        out = T.reshape(pre, shape[axis]) @ F.T
    elif pre == 1:                                 # the first axis: one product
        out = F @ T.reshape(shape[axis], post)
    else:
        out = np.matmul(F, T.reshape(pre, shape[axis], post))
    return out.reshape(shape[:axis] + (F.shape[0],) + shape[axis + 1:])


class _Factor:
    """One column's factor of a measurement, applied the cheapest way: skipped (identity),
    gathered and scattered (each row a single 1: a GROUP BY's returned parts), or by a
    matrix product."""

    def __init__(self, F: np.ndarray):
        self.F, self.n = F, F.shape[1]
        single = bool(np.all((F == 1.0).sum(axis=1) == 1) and
                      np.all((F != 0).sum(axis=1) == 1))
        self.index = np.argmax(F, axis=1) if single else None   # the 1 of each row
        if single and len(set(self.index.tolist())) != len(self.index):
            self.index = None                      # a part picked twice: use the product
        self.identity = self.index is not None and F.shape[0] == self.n and \
            bool(np.all(self.index == np.arange(self.n)))

    @functools.cached_property
    def norm(self) -> float:
        """``‖F‖₂`` (1 for distinct picks)."""
        return 1.0 if self.index is not None else float(np.linalg.norm(self.F, 2))

    def forward(self, T: np.ndarray, axis: int) -> np.ndarray:
        if self.identity:
            return T
        if self.index is not None:
            return np.take(T, self.index, axis=axis)
        return _mode(T, self.F, axis)

    def adjoint(self, T: np.ndarray, axis: int) -> np.ndarray:
        if self.identity:
            return T
        if self.index is not None:
            shape = list(T.shape)
            shape[axis] = self.n
            out = np.zeros(shape)
            where = [slice(None)] * T.ndim
            where[axis] = self.index
            out[tuple(where)] = T
            return out
        return _mode(T, self.F.T, axis)


class _Loss:
    """``L`` and ``∇L`` over the region tables (each measurement read through its home)."""

    def __init__(self, regions, sizes, measurements, y):
        self.sizes, self.items = sizes, []
        self.factors = {}
        start = 0
        for m in measurements:
            self.factors[id(m)] = tuple(_Factor(F) for F in m.factors)
            shape = tuple(F.shape[0] for F in m.factors)
            R = home(regions, m.columns, sizes)
            summed = tuple(a for a, i in enumerate(R) if i not in m.columns)
            target = np.asarray(y[start:start + m.size], dtype=float).reshape(shape)
            self.items.append((R, summed, m, target))
            start += m.size
        if start != len(y):
            raise ValueError(f"expected {start} measurements, got {len(y)}")

    def shape(self, R: tuple) -> tuple:
        return tuple(self.sizes[i] for i in R)

    def _apply(self, m, T, adjoint: bool = False) -> np.ndarray:
        for axis, F in enumerate(self.factors[id(m)]):
            T = F.adjoint(T, axis) if adjoint else F.forward(T, axis)
        return m.scale * T

    def gradient(self, x: dict, y_term: bool = True) -> dict:
        grad = {R: np.zeros_like(T) for R, T in x.items()}
        for R, summed, m, target in self.items:
            marginal = x[R].sum(axis=summed) if summed else x[R]
            r = self._apply(m, marginal)
            g = self._apply(m, r - target if y_term else r, adjoint=True)
            grad[R] += np.expand_dims(g, summed) if summed else g
        return grad

    def value(self, x: dict) -> float:
        total = 0.0
        for R, summed, m, target in self.items:
            marginal = x[R].sum(axis=summed) if summed else x[R]
            total += 0.5 * float(np.sum((self._apply(m, marginal) - target) ** 2))
        return total

    def lipschitz(self, regions) -> dict:
        """R -> β̂_R ≥ the Lipschitz constant of ∇L on region R (∇L is block diagonal over
        the regions: each measurement reads one): min(1.25 × a power-iteration estimate,
        ``Σ_k s_k² Π‖F_{k,i}‖₂² p_{R,C_k}``), floored at 1e-12 × the largest."""
        bound = {R: 0.0 for R in regions}
        for R, summed, m, _ in self.items:
            norm = m.scale ** 2 * math.prod(F.norm ** 2 for F in self.factors[id(m)])
            bound[R] += norm * math.prod(self.sizes[i] for i in R if i not in m.columns)
        x = {R: _probe(tuple(self.sizes[i] for i in R)) for R in regions}
        estimate = dict.fromkeys(regions, 0.0)
        for _ in range(20):
            x = {R: T / (math.sqrt(_squares(T)) or 1.0) for R, T in x.items()}
            x = self.gradient(x, y_term=False)
            estimate = {R: math.sqrt(_squares(T)) for R, T in x.items()}
        beta = {R: min(1.25 * estimate[R], bound[R]) for R in regions}
        floor = 1e-12 * max(max(beta.values(), default=0.0), 1e-300)
        return {R: max(b, floor) for R, b in beta.items()}


def _squares(T: np.ndarray) -> float:
    """``Σ T²`` without BLAS (whose threads only add wake-ups at these sizes)."""
    flat = T.reshape(-1)
    return float(np.einsum("i,i->", flat, flat))


def _norm(x: dict) -> float:
    return math.sqrt(sum(_squares(T) for T in x.values()))


def _probe(shape: tuple) -> np.ndarray:
    """A fixed, generic start for the power iteration (no random numbers)."""
    n = math.prod(shape)
    return (1.0 + 0.5 * np.cos(np.arange(n) * 0.731 + 0.1)).reshape(shape)


def estimate(sizes, measurements, y, *, tolerance: float = TOLERANCE,
             max_rounds: int = MAX_ROUNDS, start=None, check=None,
             regions=None) -> tuple[dict, int]:
    """(region tables ``R -> μ_R`` ≥ 0, rounds used): the local-polytope estimate (module
    docstring) from linear measurements of the marginals
    (:class:`~dpsql.workload.marginals.MarginalMeasurement` s) and their values ``y``
    (concatenated in order). ``start``: a callable from the regions to their starting tables
    (the least-squares marginals: then a feasible optimum is found at once) or None, which
    (like no ``start``) starts from a conjugate-gradient least-squares solve.
    ``check``: called every 50 rounds (a cancel token's check). ``regions``: cliques the
    model must hold besides the measured ones (MWEM's candidates, :mod:`dpsql.mechanisms.mwem.
    graphical`); a region no measurement reads keeps only what consistency gives it."""
    sizes = tuple(int(n) for n in sizes)
    regions = regions_of([m.columns for m in measurements] + list(regions or ()))
    loss = _Loss(regions, sizes, measurements, y)
    beta = loss.lipschitz(regions)
    subspace = Subspace(regions, sizes, beta)
    given = None if start is None else start(regions)
    z = _least_squares(loss, subspace, beta, regions) if given is None else \
        {R: np.array(T, dtype=float).reshape(tuple(sizes[i] for i in R))
         for R, T in given.items()}
    x_plus, rounds = z, 0
    for rounds in range(1, max_rounds + 1):
        x_v = subspace.project(z)
        grad = loss.gradient(x_v)
        x_plus = {R: np.maximum(2.0 * x_v[R] - z[R] - grad[R] / beta[R], 0.0)
                  for R in regions}
        step = {R: x_plus[R] - x_v[R] for R in regions}
        z = {R: z[R] + step[R] for R in regions}
        if _norm(step) <= tolerance * max(_norm(x_v), 1.0):
            break
        if check is not None and rounds % 50 == 0:
            check()
    return x_plus, rounds


def _least_squares(loss: _Loss, subspace: Subspace, beta: dict, regions,
                   rounds: int = CG_ROUNDS) -> dict:
    """A least-squares minimiser of ``L`` in V (the start when none is given): conjugate
    gradients in V with the inner product ``Σ_R β_R ⟨·,·⟩`` (the projection's metric, so
    ``P_V`` is self-adjoint in it and ``⟨p, P_V(M⁻¹Hp)⟩_M = pᵀHp``)."""
    def inner(a: dict, b: dict) -> float:
        return sum(beta[R] * float(np.einsum("i,i->", a[R].reshape(-1), b[R].reshape(-1)))
                   for R in regions)

    x = {R: np.zeros(loss.shape(R)) for R in regions}
    grad = loss.gradient(x)
    r = subspace.project({R: -grad[R] / beta[R] for R in regions})
    p, rr = r, inner(r, r)
    first = rr
    for _ in range(rounds):
        if rr <= 1e-20 * first or rr == 0.0:
            break
        hp = loss.gradient(p, y_term=False)
        curvature = sum(float(np.einsum("i,i->", p[R].reshape(-1), hp[R].reshape(-1)))
                        for R in regions)
        if curvature <= 0:
            break
        alpha = rr / curvature
        x = {R: x[R] + alpha * p[R] for R in regions}
        step = subspace.project({R: hp[R] / beta[R] for R in regions})
        r = {R: r[R] - alpha * step[R] for R in regions}
        rr, previous = inner(r, r), rr
        p = {R: r[R] + (rr / previous) * p[R] for R in regions}
    return x


def block_answers(tables: dict, block, sizes) -> np.ndarray:
    """A block's answers from the estimated region tables (its columns' smallest region)."""
    sizes = tuple(int(n) for n in sizes)
    used = block.used
    R = home(tuple(tables), used, sizes)
    T = tables[R]
    summed = tuple(a for a, i in enumerate(R) if i not in used)
    return block.answer(T.sum(axis=summed) if summed else T)
