"""Newton-type engines: proximal Newton, hinge Newton, multinomial (in memory and on dask), L-BFGS."""
