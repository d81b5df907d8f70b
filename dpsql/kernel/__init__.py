"""The privacy boundary: the only code that reads the data.

The kernel owns noise scales (issue 15): no σ, Laplace ``b``, d_X scale, sensitivity or
Lipschitz constant computed by a caller is used before the kernel has checked it against
the charge with exact (or provably conservative) arithmetic. The matrix and d_X Laplace
releases check before the charge; data-dependent runs (MWEM, d_X MWEM, SmallDB) check each
step in their oracle before it spends or samples, which can only be after the run's charge.
Each method's docstring states its privacy argument.

Nothing but ``y`` crosses this boundary: strategies, inference and result writing see only
``y``, ``W``, ``A`` and σ. If the charge is refused, nothing was read, released or charged.
Charging *before* the data is read means that whatever happens once the data is touched —
an answer, or an engine failure that some row might provoke — has been paid for: no outcome
that depends on the data is ever free. (The engine is also written so that no value can make
the count fail; this ordering is the backstop.) If anything fails after the charge, the
budget stays spent (never a free retry of fresh noise).

The package exports nothing; callers import its modules:

- :mod:`dpsql.kernel.boundary`: ``Kernel`` (charge, read, add noise) and ``Measurement``;
- :mod:`dpsql.kernel.scales`: every check of a noise scale and of a charge, from public inputs;
- :mod:`dpsql.kernel.oracles`: ``MeasureOracle``, MWEM's measure callback;
- :mod:`dpsql.kernel.metric_oracle`: ``MetricMeasureOracle``, the d_X measure callback;
- :mod:`dpsql.kernel.data`: the reads of the protected rows, the only module that imports
  :mod:`dpsql.engines` (import-linter contracts in ``pyproject.toml``).
"""
