"""Block coordinate descent and block Newton on a dask array or a grid: in memory, as a task
graph or collectively."""
