"""Strategies: plans, their errors and sensitivities, the caches."""
