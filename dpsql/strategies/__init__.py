"""Strategies: a plain dict registry, name -> strategy object (see ``base.Strategy``)."""

from __future__ import annotations

from .base import (Plan, Strategy, WorkloadInfo, exact_l1_sensitivity, exact_l2_sensitivity,
                   l2_sensitivity,
                   make_plan)
from .coa import COA
from .eigen import EigenDesign
from .fourier import FourierStrategy
from .hierarchical import HierarchicalStrategy
from .identity import IdentityStrategy
from .optimal import Optimal
from .wavelet import WaveletStrategy
from .workload import WorkloadStrategy

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
