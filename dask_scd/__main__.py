"""``python -m dask_scd``: the command line (:mod:`dask_scd.cli`), as ``dask-scd``."""

import sys

from dask_scd.cli import main

if __name__ == "__main__":
    sys.exit(main())
