"""Workloads: declared column domains and the matrices over cells (W, the strategy A and its exact sensitivities)."""
