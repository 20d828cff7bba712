"""CoCoA: local solvers on the partitions of a cluster, their updates combined."""
