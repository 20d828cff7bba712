"""SCD with an L1 part: working sets, Anderson and dual extrapolation; the coarse step's
cost guard."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_diabetes

import dask_scd
from dask_scd import objectives as obj
from dask_scd.datasets import make_onehot
from dask_scd.engines import coarse
from dask_scd.engines.local import scd
from dask_scd.kernels import cpu
from dask_scd.kernels.layout import MajorMatrix


def _onehot_regression(n=4000, fields=6, cardinality=30, seed=0):
    X, _, _ = make_onehot(n, fields, cardinality, random_state=seed)
    rng = np.random.default_rng(seed + 1)
    w = np.where(rng.random(X.shape[1]) < 0.2, rng.standard_normal(X.shape[1]), 0.0)
    return X, X @ w + 0.3 * rng.standard_normal(n)


def _cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), y


# ------------------------------------------------------------------------- kernels


def test_epoch_violation_matches_numpy_in_one_epoch(rng):
    n, p = 50, 6
    X = rng.normal(size=(n, p))
    y = rng.normal(size=n)
    problem = obj.Problem("squared", 0.1, 1.0, False)
    m = MajorMatrix.from_array(X, "columns")
    coef = rng.normal(scale=0.2, size=p)
    order = rng.permutation(p)
    margins = X @ coef
    ref_coef, expected = coef.copy(), 0.0
    for j in order:  # the exact coordinate minimizer, as the kernel's squared-loss step
        g = (X @ ref_coef - y) @ X[:, j] / n
        expected = max(
            expected, float(scd._violations(problem, ref_coef[j : j + 1], np.array([-g]))[0])
        )
        h = X[:, j] @ X[:, j] / n
        z = h * ref_coef[j] - g
        ref_coef[j] = np.sign(z) * max(abs(z) - problem.l1, 0.0) / h
    _, _, violation = cpu.scd_epoch_violation(
        m.data,
        m.indices,
        m.indptr,
        m.dense,
        n,
        y,
        margins,
        coef,
        np.array([0.0]),
        order,
        problem.loss_code,
        problem.l1,
        problem.l2,
        m.sq_norms(),
        np.zeros(0),
    )
    assert violation == pytest.approx(expected, rel=1e-10)
    np.testing.assert_allclose(coef, ref_coef, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("sparse", [False, True])
def test_product_kernels_match_numpy(rng, sparse):
    dense = rng.normal(size=(40, 9))
    dense[rng.random(dense.shape) < 0.5] = 0.0
    m = MajorMatrix.from_array(sp.csr_matrix(dense) if sparse else dense, "columns")
    v, w = rng.normal(size=40), rng.normal(size=40)
    xv, xw = m.dot_pair(v, w)
    np.testing.assert_allclose(xv, dense.T @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(xw, dense.T @ w, rtol=1e-12, atol=1e-12)
    # Dense: the single product's loop with two sums. Its bits are the single product's
    # only where LLVM vectorizes one sum and two sums alike, which depends on the CPU.
    np.testing.assert_allclose(xv, m.dot(v), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(xw, m.dot(w), rtol=1e-13, atol=1e-13)
    lines = np.array([1, 4, 7])
    values = np.array([0.5, 0.0, -2.0])
    out = m.lines_scatter(lines, values, 0.3, np.empty(40))
    np.testing.assert_allclose(out, dense[:, lines] @ values + 0.3, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m.line_nnz(), (dense != 0).sum(0) if sparse else 40)


def test_anderson_weights_find_the_fixed_point_of_a_linear_map(rng):
    """For x ← Ax + b in dimension d ≤ K, K + 1 iterates determine the fixed point."""
    d = 4
    A = rng.normal(size=(d, d))
    A *= 0.9 / np.abs(np.linalg.eigvals(A)).max()
    b = rng.normal(size=d)
    iterates = [rng.normal(size=d)]
    for _ in range(scd._ANDERSON_K):
        iterates.append(A @ iterates[-1] + b)
    iterates = np.array(iterates)
    weights = scd._affine_weights(iterates)
    fixed = np.linalg.solve(np.eye(d) - A, b)
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(weights @ iterates[1:], fixed, rtol=1e-6, atol=1e-6)
    assert np.linalg.norm(iterates[-1] - fixed) > 1e-2  # the plain iterate is far


# ------------------------------------------------------------------- working sets


@pytest.mark.parametrize("penalty,l1_ratio", [("l1", 1.0), ("elasticnet", 0.5)])
def test_working_set_orders_the_work_never_the_answer(monkeypatch, penalty, l1_ratio):
    """Minimal working sets (1 zero beside the support) and working sets of every feature
    give the same certified model; the minimal ones grow several times on the way."""
    X, y = _onehot_regression()
    kwargs = dict(
        penalty=penalty,
        l1_ratio=l1_ratio,
        alpha=2e-3,
        tol=1e-10,
        solver="scd",
        random_state=0,
        max_iter=5000,
    )
    sizes = []
    grow = scd._grow_working_set

    def recording(*args):
        chosen, size = grow(*args)
        sizes.append(size)
        return chosen, size

    monkeypatch.setattr(scd, "_MIN_WORKING_SET", 1)
    monkeypatch.setattr(scd, "_grow_working_set", recording)
    small = dask_scd.fit(X, y, **kwargs)
    monkeypatch.setattr(scd, "_MIN_WORKING_SET", X.shape[1])
    full = dask_scd.fit(X, y, **kwargs)
    assert small.converged_ and full.converged_
    assert len(set(sizes)) >= 3 and sizes[0] < 0.2 * X.shape[1]
    support = np.flatnonzero(full.coef_)
    assert 0 < len(support) < X.shape[1]
    np.testing.assert_array_equal(np.flatnonzero(small.coef_), support)
    # One-hot groups sum to the intercept: along that flat direction only the L2 term
    # curves, and a gap G pins θ to ‖θ − θ*‖ ≤ √(2G/l2) (the lasso's 1e-10 gap: ~1e-7).
    atol = 1e-6
    if l1_ratio < 1:
        l2 = 2e-3 * (1 - l1_ratio)
        gaps = (small.dual_gap_ + full.dual_gap_) * abs(full.primal_)
        atol = max(atol, float(np.sqrt(2 * gaps / l2)))
    np.testing.assert_allclose(small.coef_, full.coef_, rtol=1e-5, atol=atol)
    assert small.primal_ == pytest.approx(full.primal_, rel=1e-9)


def test_a_feature_outside_the_first_working_set_enters(monkeypatch):
    """The feature with the smallest correlation at θ = 0 can be non-zero at the optimum
    (a suppressor): it is ranked last at first and must be admitted by a certificate."""
    rng = np.random.default_rng(3)
    n = 500
    z = rng.normal(size=n)
    noise = rng.normal(size=n)
    X = np.column_stack([z + noise, noise] + [rng.normal(size=n) for _ in range(6)])
    y = z + 0.05 * rng.normal(size=n)
    c0 = np.abs(X.T @ (y - y.mean())) / n
    assert np.argmin(c0) == 1 or c0[1] < 0.1 * c0[0]
    monkeypatch.setattr(scd, "_MIN_WORKING_SET", 1)
    ours = dask_scd.fit(X, y, penalty="l1", alpha=0.01, tol=1e-12, solver="scd", random_state=0)
    from sklearn.linear_model import Lasso

    sk = Lasso(alpha=0.01, tol=1e-14, max_iter=100_000).fit(X, y)
    assert ours.converged_ and ours.coef_[1] != 0
    np.testing.assert_allclose(ours.coef_, sk.coef_, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------- certified gap tightness


CASES = {
    "lasso-onehot": (_onehot_regression, "squared", 1.0, 2e-3),
    "enet-diabetes": (lambda: load_diabetes(return_X_y=True), "squared", 0.5, 0.01),
    "logistic-l1-cancer": (_cancer, "logistic", 1.0, 0.01),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_certified_gap_is_never_below_the_true_error(case):
    """At every certificate of an L1 fit the certified gap P − D (the best of the plain,
    the extrapolated and the kept dual points) is at least the true error P − P*."""
    make, loss, l1_ratio, alpha = CASES[case]
    X, y = make()
    kwargs = dict(
        loss=loss,
        penalty="elasticnet",
        l1_ratio=l1_ratio,
        alpha=alpha,
        solver="scd",
        random_state=0,
        max_iter=20_000,
    )
    reference = dask_scd.fit(X, y, tol=1e-14, **kwargs)
    p_star = reference.primal_ * (1 - reference.dual_gap_)  # a lower bound on P*
    fit = dask_scd.fit(X, y, tol=1e-7, **kwargs)
    gaps = np.asarray(fit.history_.relative_gap) * np.abs(fit.history_.primal)
    errors = np.asarray(fit.history_.primal) - p_star
    assert len(gaps) >= 2 and fit.converged_
    assert np.all(gaps >= errors - 1e-14 * abs(p_star))
    assert fit.primal_ == pytest.approx(reference.primal_, rel=1e-7)


# ----------------------------------------------------------------- coarse cost guard


def _count_detection(monkeypatch):
    from dask_scd.grid import partition

    calls = []
    detect = partition.detect_pure_blocks

    def counting(X, *args, **kwargs):
        calls.append(X.shape)
        return detect(X, *args, **kwargs)

    monkeypatch.setattr(partition, "detect_pure_blocks", counting)
    return calls


def test_coarse_step_is_skipped_with_140_blocks(monkeypatch):
    """50k rows, 140 one-hot fields: the curvature SᵀDS costs Σ s_i² ≈ n·141² operations
    against ≈ 4·141·n for an epoch; no row sample both fits the budget and estimates 141
    dimensions, so the model says no, before any block is even detected."""
    X, y, _ = make_onehot(50_000, 140, 2, random_state=0)
    problem = obj.Problem("logistic", 1e-4, 0.0, True)
    plan = coarse.LocalCoarse.cost_bound(X, problem)
    touches = np.diff(X.indptr) + 1
    assert plan.epoch == pytest.approx(4.0 * (X.nnz + X.shape[0]))
    assert float(touches @ touches) > 30 * plan.epoch  # the full curvature: 35 epochs
    assert not plan.used
    assert X.shape[0] / plan.stride < coarse.ROWS_PER_DIMENSION * touches.max()
    calls = _count_detection(monkeypatch)
    assert coarse.LocalCoarse.build(X, problem) is None
    assert calls == []


def test_coarse_step_costs_a_quarter_of_the_epochs_it_serves():
    """20 one-hot fields: the step runs, on a row sample, spaced so that its counted
    operations stay within 1/4 of the epochs between two steps (the curvature within
    1/10 of one)."""
    X, _, _ = make_onehot(20_000, 20, 50, random_state=0)
    problem = obj.Problem("logistic", 1e-4, 0.0, True)
    space = coarse.LocalCoarse.build(X, problem)
    assert space is not None and not space.flat
    plan = space.cost
    S = space.row_sums
    s = np.diff(S.indptr).astype(float)
    assert S.shape[1] == 21 and np.all(s == 21)
    assert plan.stride > 1 and (s @ s) / plan.stride <= coarse.HESSIAN_BUDGET * plan.epoch
    assert plan.step <= coarse.BUDGET * plan.spacing * plan.epoch
    assert plan.spacing <= coarse.MAX_SPACING


def test_coarse_step_on_a_row_sample_still_descends(rng):
    """A step with the sampled curvature lowers the objective (line search, or the exact
    step along the direction for the squared loss)."""
    X, y_cls, _ = make_onehot(6000, 5, 8, random_state=1)
    sampled = coarse.LocalCoarse.build(X, obj.Problem("logistic", 1e-3, 0.0, True))
    assert sampled is not None and sampled.cost.stride > 1
    for loss, y in (("logistic", y_cls), ("squared", y_cls + 0.3 * rng.normal(size=6000))):
        problem = obj.Problem(loss, 1e-3, 0.0, True)
        # the squared loss's own plan skips the step here; reuse the logistic's sample
        space = coarse.LocalCoarse(sampled.row_sums, sampled.blocks, True, False, sampled.cost)
        coef = rng.normal(scale=0.5, size=X.shape[1])
        intercept = 0.2
        margins = X @ coef + intercept

        def objective(c, m):
            return obj.loss_value(loss, y, m).mean() + obj.penalty_value(problem, c)

        before = objective(coef, margins)
        intercept = space.step(problem, y, margins, coef, intercept)
        np.testing.assert_allclose(margins, X @ coef + intercept, atol=1e-10)
        assert objective(coef, margins) < before
