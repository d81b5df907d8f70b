"""Free answers from past releases: generalised least squares over stored measurements.

Every matrix-mechanism release keeps what it published: its noisy measurements ``y``, its
strategy ``A`` over its cells, and the noise (family and scale). All of it is the output of a
release that was already charged, so using it again is post-processing (Dwork & Roth 2014,
Prop. 2.1): a later batch whose queries are linear combinations of what was measured is
answered from it at **no privacy cost**, and a batch that needs new measurements pays only
for those and combines old and new optimally.

Everything here reads public inputs only: stored releases (already public) and the compiled
batch. Which queries are free depends on what was released before, never on the data.

- :mod:`~dpsql.mechanisms.reuse.records`: a release's measurements as stored
  (``dpsql.measurements``) and the domain fingerprint saying which may be combined;
- :mod:`~dpsql.mechanisms.reuse.pool`: the common refinement and the GLS pool;
- :mod:`~dpsql.mechanisms.reuse.decide`: which rows are free and what the rest costs;
- :mod:`~dpsql.mechanisms.reuse.blocks`: the same pool per clique region of a batch compiled
  to Kronecker blocks (issue 16), over its marginals only (the release side:
  :mod:`dpsql.release.implicit_reuse`).
"""
