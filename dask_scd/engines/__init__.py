"""Engines: the ways of running the same problem, in families.

- :mod:`~dask_scd.engines.local`: coordinate and dual coordinate descent on one machine
  (scd, sdca, gram, duhl, sdca out of core).
- :mod:`~dask_scd.engines.newton`: Newton-type engines in memory (proximal Newton, hinge
  Newton, multinomial, L-BFGS) and multinomial Newton on dask.
- :mod:`~dask_scd.engines.block`: block coordinate descent and block Newton on a dask
  array or a grid, in memory, as a task graph or collectively.
- :mod:`~dask_scd.engines.cocoa`: CoCoA's partitions on a cluster.

Beside them: :mod:`~dask_scd.engines.registry` (what each engine solves),
:mod:`~dask_scd.engines.planner` (the one place that decides), :mod:`~dask_scd.engines.base`
(the seam every engine implements), the certificates and the coarse levels they share.
"""
