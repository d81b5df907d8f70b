"""Strategies for Laplace noise (L1 sensitivity): candidates, the L1 program and tree refinements."""
