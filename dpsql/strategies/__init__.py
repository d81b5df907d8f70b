"""Strategies: a plain dict registry, name -> strategy object (see ``base.Strategy``)."""

from __future__ import annotations

from .base import (Plan, Strategy, WorkloadInfo, exact_l2_sensitivity, l2_sensitivity,
                   make_plan)
from .eigen import EigenDesign
from .fourier import FourierStrategy
from .hierarchical import HierarchicalStrategy
from .identity import IdentityStrategy
from .wavelet import WaveletStrategy
from .workload import WorkloadStrategy

REGISTRY: dict[str, Strategy] = {
    "identity": IdentityStrategy(),
    "workload": WorkloadStrategy(),
    "hierarchical": HierarchicalStrategy(),
    "wavelet": WaveletStrategy(),
    "fourier": FourierStrategy(),
    "eigen": EigenDesign(),
}

#: candidates ``auto`` compares, in order of preference on ties
AUTO_CANDIDATES = ("identity", "workload", "hierarchical", "wavelet", "fourier", "eigen")

__all__ = ["AUTO_CANDIDATES", "Plan", "REGISTRY", "Strategy", "WorkloadInfo", "exact_l2_sensitivity",
           "l2_sensitivity", "make_plan"]
