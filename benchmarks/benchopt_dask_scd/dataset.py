"""benchopt dataset of LIBSVM files from a local folder: installed as
``datasets/libsvm_files.py`` into each benchmark copy by ``benchmarks/bench_benchopt.py``,
which names the folder in ``DASK_SCD_LIBSVM_DIR`` and selects only the files present.
Nothing is downloaded.
"""

from benchopt import BaseDataset, safe_import_context

with safe_import_context() as import_ctx:
    import os

    import numpy as np
    import scipy.sparse as sp
    from sklearn.datasets import load_svmlight_file

FOLDER = "DASK_SCD_LIBSVM_DIR"


class Dataset(BaseDataset):
    name = "LIBSVM-files"

    # Adult (a8a: 22,696 rows; a9a.t: 16,281 rows; 123 binary features, labels ±1).
    parameters = {"file": ["a8a", "a9a.t"]}

    def get_data(self):
        folder = os.environ.get(FOLDER)
        if not folder:
            raise RuntimeError(f"{FOLDER} must name the folder of the LIBSVM files")
        X, y = load_svmlight_file(os.path.join(folder, self.file))
        # CSR float64 as read, with 32-bit indices: scikit-learn's and celer's sparse
        # coordinate descent refuse 64-bit ones. Labels ±1, regression targets for the
        # Lasso.
        X = sp.csr_matrix(
            (X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)), shape=X.shape
        )
        return dict(X=X, y=np.asarray(y, dtype=np.float64))
