"""Realistic generated data sets that need no download."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def make_onehot(
    n_samples: int = 100_000,
    n_fields: int = 20,
    cardinality: int | list[int] = 1000,
    *,
    set_valued: int = 0,
    set_size: int = 5,
    zipf: float = 1.0,
    task: str = "classification",
    noise: float = 1.0,
    dtype=np.float64,
    random_state=None,
):
    """A one-hot encoded categorical design (Criteo-like), with a planted linear model.

    Each of ``n_fields`` categorical variables takes one of ``cardinality`` values per
    example, drawn from a Zipf law of exponent ``zipf`` (value k of a field with
    probability ∝ 1/(k+1)^zipf: a few frequent values, a long tail), and is
    one-hot encoded: a *pure* block of features (one non-zero per row). ``set_valued``
    extra fields hold up to ``set_size`` values each (tags, bag of words): *impure* blocks.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
        ±1 labels (``task="classification"``, logistic model) or real values.
    blocks : list of ndarray
        Feature indices of each field, in order (the variable groups).
    """
    if not zipf > 0.0:
        raise ValueError(f"zipf must be a number > 0, got {zipf!r}")
    rng = np.random.default_rng(random_state)
    sizes = [cardinality] * n_fields if np.isscalar(cardinality) else list(cardinality)
    sizes += [sizes[-1] if sizes else 100] * set_valued
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    cols, rows = [], []
    for field, size in enumerate(sizes):
        per_row = 1 if field < n_fields else set_size
        # Zipf popularity: value k drawn with probability ∝ 1/(k+1)^zipf.
        ranks = np.arange(1, size + 1)
        weights = 1.0 / ranks if zipf == 1.0 else ranks.astype(np.float64) ** -zipf
        values = rng.choice(size, size=(n_samples, per_row), p=weights / weights.sum())
        keep = np.ones_like(values, dtype=bool)
        if per_row > 1:  # a set: drop repeats within a row
            values = np.sort(values, axis=1)
            keep[:, 1:] = values[:, 1:] != values[:, :-1]
        r = np.broadcast_to(np.arange(n_samples)[:, None], values.shape)[keep]
        rows.append(r)
        cols.append(values[keep] + offsets[field])
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    X = sp.csr_matrix(
        (np.ones(len(rows), dtype=dtype), (rows, cols)), shape=(n_samples, int(offsets[-1]))
    )
    X.sum_duplicates()
    truth = rng.normal(scale=1.0, size=X.shape[1])
    score = X @ truth / np.sqrt(n_fields + set_valued) - 0.5
    if task == "classification":
        prob = 1.0 / (1.0 + np.exp(-score))
        y = np.where(rng.random(n_samples) < prob, 1.0, -1.0)
    else:
        y = score + noise * rng.normal(size=n_samples)
    blocks = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))]
    return X, y, blocks


def make_binary_features(
    n_samples: int = 50_000,
    n_features: int = 300,
    *,
    frequency: tuple[float, float] = (5e-4, 0.2),
    nested: float = 0.8,
    overlap: float = 0.95,
    informative: float = 0.5,
    positives: float = 0.03,
    random_state=None,
):
    """Sparse binary features with nested, strongly correlated columns (web-page keywords,
    w8a-like), and rare positive labels from a planted logistic model.

    Each feature is either drawn on its own, present in a row with a frequency drawn
    log-uniformly from ``frequency``, or (with probability ``nested``) nested in an
    earlier one: present where that one is, with probability ``overlap``, and rarely
    elsewhere. A share ``informative`` of the features has a normal weight (scale 2);
    the score is shifted so that about ``positives`` of the rows have a positive label.
    With no intercept and a weak L1 penalty the Hessian over the support is badly
    conditioned: the case for second-order inner solvers.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
        ±1 labels.
    """
    rng = np.random.default_rng(random_state)
    rate = np.exp(rng.uniform(np.log(frequency[0]), np.log(frequency[1]), n_features))
    columns = []
    for j in range(n_features):
        if j > 0 and rng.random() < nested:
            parent = columns[rng.integers(j)]
            column = (parent & (rng.random(n_samples) < overlap)) | (
                rng.random(n_samples) < 0.3 * rate[j]
            )
        else:
            column = rng.random(n_samples) < rate[j]
        columns.append(column)
    X = sp.csr_matrix(np.array(columns).T.astype(np.float64))
    truth = np.where(
        rng.random(n_features) < informative, rng.normal(scale=2.0, size=n_features), 0.0
    )
    score = X @ truth
    score -= np.quantile(score, 1.0 - positives)
    y = np.where(rng.random(n_samples) < 1.0 / (1.0 + np.exp(-score)), 1.0, -1.0)
    return X, y
