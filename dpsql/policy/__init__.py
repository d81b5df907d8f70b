"""Policies: the data owner's declared domains, budgets and record metric (frozen values, TOML loading)."""
