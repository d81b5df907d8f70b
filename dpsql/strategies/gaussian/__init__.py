"""Strategies optimised for Gaussian noise (L2 sensitivity): Eigen-Design, the certified optimum, COA."""
