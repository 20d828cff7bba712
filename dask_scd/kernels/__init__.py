"""Per-chunk numerical kernels: numba CPU kernels and their plain-numpy reference."""
