"""Strategies: a plain dict registry, name -> strategy object (see ``base.Strategy``)."""

from __future__ import annotations

from dpsql.workload.matrix import (Plan, Strategy, WorkloadInfo, exact_l1_sensitivity, exact_l2_sensitivity,
                   l2_sensitivity,
                   make_plan)
from dpsql.strategies.gaussian.coa import COA
from dpsql.strategies.gaussian.eigen import EigenDesign
from dpsql.strategies.fourier import FourierStrategy
from dpsql.strategies.hierarchical import HierarchicalStrategy
from dpsql.strategies.identity import IdentityStrategy
from dpsql.strategies.gaussian.optimal import Optimal
from dpsql.strategies.wavelet import WaveletStrategy
from dpsql.strategies.workload import WorkloadStrategy

REGISTRY: dict[str, Strategy] = {
    "identity": IdentityStrategy(),
    "workload": WorkloadStrategy(),
    "hierarchical": HierarchicalStrategy(),
    "wavelet": WaveletStrategy(),
    "fourier": FourierStrategy(),
    "eigen": EigenDesign(),
    "optimal": Optimal(),
    "coa": COA(),
}

#: candidates ``auto`` compares, in order of preference on ties
#: (``coa`` is the paper's Newton method, asked for by name; ``optimal`` reaches the same
#: certified optimum faster, so auto uses it)
AUTO_CANDIDATES = ("identity", "workload", "hierarchical", "wavelet", "fourier", "eigen",
                   "optimal")

__all__ = ["AUTO_CANDIDATES", "Plan", "REGISTRY", "Strategy", "WorkloadInfo", "exact_l1_sensitivity", "exact_l2_sensitivity",
           "l2_sensitivity", "make_plan"]
