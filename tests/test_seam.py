"""The engine seam: pinned iterates, the registry, one copy of the scalar math, no cycles."""

from __future__ import annotations

import json
from pathlib import Path

import kernel_reference as reference
import numpy as np
import pytest
import scipy.special

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines import registry
from dask_scd.engines.base import Options, Run
from dask_scd.kernels import scalar

PACKAGE = Path(dask_scd.__file__).resolve().parent


# Fits without an L2 term to bound their Hessian's condition, and the factor by which their
# tolerance is looser: the last bits of a gradient's sums (another vector width, AVX2
# against AVX-512) move the unpenalized logistic Newton steps on breast cancer by 4e-12
# of the vector's scale (3e-11 relative), where the regularized fits move by ~1e-14.
_ILL_CONDITIONED = {"newton-unpenalized": 1e3}


@pytest.mark.slow
def test_iterates_are_pinned():
    """A few epochs of every engine give the iterates recorded in tests/data (written by
    tests/pin_iterates.py before the engines moved behind the registry). The comparison
    allows 1e-12 relative (1e-13 of the largest coordinate near 0): the kernels reassociate sums (fast-math), so another CPU's
    vector width may change the last bits; on one machine they are bit-identical."""
    from pin_iterates import PINNED, run_cases

    pinned = json.loads(PINNED.read_text())
    got = run_cases()
    assert got.keys() == pinned.keys()
    for name, case in pinned.items():
        expected = np.array([float.fromhex(v) for v in case["coef"]])
        coef = np.array([float.fromhex(v) for v in got[name]["coef"]])
        assert got[name]["n_iter"] == case["n_iter"], name
        # A coordinate near 0 inherits the rounding of the large ones: atol at the scale
        # of the vector (AMD and Intel CPUs differ by ~1e-14 there).
        looser = _ILL_CONDITIONED.get(name, 1.0)
        atol = 1e-13 * looser * max(np.abs(expected).max(), 1e-1)
        np.testing.assert_allclose(coef, expected, rtol=1e-12 * looser, atol=atol, err_msg=name)
        intercept = [float.fromhex(v) for v in case["intercept"]]
        assert [float.fromhex(v) for v in got[name]["intercept"]] == pytest.approx(
            intercept, rel=1e-12 * looser, abs=1e-14 * looser
        ), name


def _toy_engine(data: InMemory, problem, options: Options) -> Run:
    """Gradient descent on ridge: an engine written in one function, for the test below."""
    X, y = data.X, data.y
    n, p = X.shape
    step = 1.0 / (np.linalg.norm(X, 2) ** 2 / n + problem.alpha)
    coef = np.zeros(p)
    for _ in range(options.max_iter):
        coef -= step * (X.T @ (X @ coef - y) / n + problem.alpha * coef)
    cert = obj.certificate(problem, X, y, coef, 0.0)
    options.progress.update(options.max_iter, cert.relative_gap, cert.primal)
    return Run(coef, 0.0, cert, options.max_iter, dask_scd.History())


def test_an_engine_is_one_function_and_one_registry_line(rng, monkeypatch):
    monkeypatch.setitem(
        registry.ENGINES,
        "toy",
        registry.Engine("toy", f"{__name__}:_toy_engine", "memory", losses=("squared",), l1=False),
    )
    monkeypatch.setattr(registry, "SOLVERS", (*registry.SOLVERS, "toy"))
    X = rng.normal(size=(200, 5))
    y = X @ rng.normal(size=5)
    ours = dask_scd.fit(X, y, alpha=0.1, fit_intercept=False, solver="toy", max_iter=500, tol=1e-8)
    gram = dask_scd.fit(X, y, alpha=0.1, fit_intercept=False, solver="gram", tol=1e-12)
    assert ours.solver_ == "toy" and ours.dual_gap_ <= 1e-8
    np.testing.assert_allclose(ours.coef_, gram.coef_, rtol=1e-6)
    with pytest.raises(ValueError, match="solver='toy' solves loss in"):
        dask_scd.fit(X, np.sign(y), loss="logistic", solver="toy")


def test_engine_options_are_checked(rng):
    X, y = rng.normal(size=(50, 3)), rng.normal(size=50)
    with pytest.raises(
        TypeError,
        match=r"unknown keyword arguments \['selection'\].*"
        r"solver='scd' takes callback$",
    ):
        dask_scd.fit(X, y, solver="scd", selection="cyclic")
    with pytest.raises(
        TypeError,
        match=r"unknown keyword arguments \['chekpoint'\].*"
        r"solver='auto' runs '\w+' on this data, which takes",
    ):
        dask_scd.fit(X, y, chekpoint="fit.npz")
    with pytest.raises(ValueError, match=r"random_state='abc' must be None, an integer"):
        dask_scd.fit(X, y, random_state="abc")
    with pytest.raises(ValueError, match="not one of"):
        dask_scd.fit(X, y, solver="newtonish")


def test_unknown_or_unsuitable_solver_on_dask_input(rng):
    import dask.array as da

    X = da.from_array(rng.normal(size=(60, 4)), chunks=(30, 2))
    y = np.sign(rng.normal(size=60))
    with pytest.raises(ValueError, match="not one of"):
        dask_scd.fit(X, y, solver="nope")
    with pytest.raises(ValueError, match="smooth loss"):
        dask_scd.fit(X, y, loss="hinge", solver="block_scd")
    with pytest.raises(ValueError, match="with an L2 penalty only.*the engines that solve it"):
        dask_scd.fit(X, y, loss="logistic", penalty="l1", solver="sdca")


@pytest.mark.parametrize("loss", obj.LOSSES)
def test_scalar_losses_match_the_objectives(loss, rng):
    y = np.where(rng.random(200) < 0.5, -1.0, 1.0)
    z = 4.0 * rng.normal(size=200)
    code = obj.LOSS_CODES[loss]
    values = np.array([scalar.loss(code, yi, zi) for yi, zi in zip(y, z)])
    d1, d2 = np.array([scalar.loss_d1_d2(code, yi, zi) for yi, zi in zip(y, z)]).T
    np.testing.assert_allclose(values, obj.loss_value(loss, y, z), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(d1, obj.loss_derivative(loss, y, z), rtol=1e-12, atol=1e-15)
    if loss != "hinge":  # the hinge's kernels never use a curvature
        np.testing.assert_allclose(
            d2, obj.loss_second_derivative(loss, y, z), rtol=1e-10, atol=1e-15
        )


def test_scalar_penalty_and_prox(rng):
    problem = obj.Problem("squared", 0.3, 0.4, True)
    t = rng.normal(size=50)
    np.testing.assert_allclose(
        scalar.penalty.py_func(problem.l1, problem.l2, t), obj.penalty_terms(problem, t), rtol=1e-15
    )
    for old, g, h in rng.normal(size=(50, 3)):
        h = abs(h)
        new = scalar.prox_newton(old, g, h, problem.l1, problem.l2)
        # the minimizer of g(t − old) + h/2 (t − old)² + g_pen(t): zero subgradient at new
        grid = new + np.linspace(-1e-3, 1e-3, 201)
        model = g * (grid - old) + 0.5 * h * (grid - old) ** 2 + obj.penalty_terms(problem, grid)
        assert model[100] <= model.min() + 1e-12


@pytest.mark.parametrize("loss", obj.LOSSES)
def test_scalar_dual_step_matches_the_reference(loss, rng):
    code = obj.LOSS_CODES[loss]
    for _ in range(30):
        y = 1.0 if rng.random() < 0.5 else -1.0
        beta = rng.uniform(0.05, 0.95)
        a, m, q = beta * y, rng.normal(), rng.uniform(0.1, 3.0)
        assert scalar.dual_step(code, y, a, m, q) == pytest.approx(
            reference.dual_step(loss, y, a, m, q), rel=1e-7, abs=1e-9
        )


def _logistic_step_by_bisection(y, a, m, q):
    """The logistic dual step's root by plain bisection in the logit u (the kernel's
    equation g(u) = u + ym + q(σ(u) − β_a), increasing, bracketed), to the last bit."""
    beta_a, ym = a * y, y * m
    lo, hi = -ym - q * (1.0 - beta_a), -ym + q * beta_a
    for _ in range(2000):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if mid + ym + q * (scipy.special.expit(mid) - beta_a) > 0.0:
            hi = mid
        else:
            lo = mid
    return y * scipy.special.expit(0.5 * (lo + hi)) - a


@pytest.mark.parametrize("y", [1.0, -1.0])
def test_logistic_dual_step_at_the_bounds(y):
    """Roots within 1e-100 of β's bounds (margins of ±300), points at the bounds, and
    curvatures from 1e-3 to 500: the step is the root of its equation, to 1e-12."""
    code = obj.LOSS_CODES["logistic"]
    for beta in (0.0, 1e-12, 0.3, 1.0 - 1e-12, 1.0):
        for m in (-300.0, -30.0, -1.0, 0.0, 2.0, 30.0, 300.0):
            for q in (1e-3, 1.0, 500.0):
                a = beta * y
                t = scalar.dual_step(code, y, a, m, q)
                expected = _logistic_step_by_bisection(y, a, m, q)
                assert 0.0 <= (a + t) * y <= 1.0, (beta, m, q)
                assert t == pytest.approx(expected, rel=1e-12, abs=1e-15), (beta, m, q)


@pytest.mark.parametrize("y", [1.0, -1.0])
def test_logistic_dual_step_with_a_steep_equation(y):
    """Curvatures q of 1e4 to 1e6 (‖x‖²/(αn) at a weak penalty) with roots near β = 0
    or 1: Newton's points may alternate between the flanks of g's steep part; the step is
    still the root, to 1e-12 (it stopped at β = 0.97 for a root at 4.5e-5, the visit
    lowering the dual)."""
    code = obj.LOSS_CODES["logistic"]
    for beta in (5.29339e-35, 1e-8, 0.5, 1.0 - 1e-8):
        for m in (-3.56381, -40.0, 3.56381, 40.0):
            for q in (1e4, 301927.0, 1e6):
                a = beta * y
                t = scalar.dual_step(code, y, a, m * y, q)
                expected = _logistic_step_by_bisection(y, a, m * y, q)
                assert t == pytest.approx(expected, rel=1e-12, abs=1e-15), (beta, m, q)


def test_the_layers_and_no_import_circle():
    """import-linter's contracts in pyproject.toml: every layer (public API, engines, cluster
    runtime, data, grid store, math) imports only from the layers below it, and no two
    modules of a package import each other, even through imports inside functions."""
    from importlinter.cli import lint_imports

    config = PACKAGE.parent / "pyproject.toml"
    assert lint_imports(config_filename=str(config), no_cache=True) == 0, (
        "an import breaks the layers or closes a circle: run `.venv/bin/lint-imports`"
    )


def test_auto_is_decided_by_the_planner_alone():
    """No module but the registry (declarations, cost model) and the planner resolves an
    engine or decides where a fit runs; fit and path ask the planner."""
    deciding = (
        "registry.resolve(",
        "registry.dask_auto(",
        "cost_model.predicted_passes(",
        "engines_solving(",
    )
    allowed = {PACKAGE / "engines" / "registry.py", PACKAGE / "engines" / "planner.py"}
    for module in PACKAGE.rglob("*.py"):
        if module in allowed:
            continue
        text = module.read_text()
        assert not [call for call in deciding if call in text], module


def test_every_result_carries_its_plan(rng):
    X, y = rng.normal(size=(80, 4)), rng.normal(size=80)
    auto = dask_scd.fit(X, y, alpha=0.1)
    assert auto.extras_["plan"]["engine"] == auto.solver_
    assert auto.extras_["plan"]["rule"] == "the fewest predicted passes over X"
    assert auto.solver_ == min(
        auto.extras_["plan"]["predicted_passes"], key=auto.extras_["plan"]["predicted_passes"].get
    )
    named = dask_scd.fit(X, y, alpha=0.1, solver="scd")
    assert named.extras_["plan"] == {
        "engine": "scd",
        "device": "cpu",
        "rule": "named",
        "predicted_passes": None,
    }


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command):
    """The tree passes ruff's lint rules and its format (pyproject.toml's [tool.ruff])."""
    import subprocess
    import sys

    root = PACKAGE.parent
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_layers_name_every_module():
    """Every module and package of dask_scd sits in one of the import-linter layers."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    modules = {f"dask_scd.{path.stem}" for path in PACKAGE.glob("*.py")} - {"dask_scd.__init__"}
    packages = {f"dask_scd.{path.parent.name}" for path in PACKAGE.glob("*/__init__.py")}
    assert modules | packages <= named, (modules | packages) - named
