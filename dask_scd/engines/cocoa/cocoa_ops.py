"""The task math of the CoCoA engine (:mod:`dask_scd.engines.cocoa.cocoa`).

Pure functions of a part (:class:`~dask_scd.engines.cocoa.cocoa_parts.Part`) and of the
shared vector, run in-process for in-memory X or as dask tasks on the worker that holds
the part; every sum over parts runs in part order (:func:`sum_partials`), so the model
does not depend on where a part ran. ``"adaptive"`` aggregation takes the γ that
minimizes the primal objective (maximizes the dual) along the summed direction exactly:
in closed form for ridge (the paper's printed formulas drop the −y and misprint the
denominator; ours are in ``docs/engines/cocoa.md``), else by a Newton iteration
safeguarded by bisection (:func:`line_minimum`). With sample weights v (mean 1) the
primal weighs each example's loss, derivatives and line terms; the dual moves u = a/v in
the unweighted box, as SDCA does, and its line and certificate read a = v∘u.
"""

from __future__ import annotations

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import WeightedLabels, labels, row_weights
from dask_scd.engines.certificates import margins_dual_point
from dask_scd.engines.cocoa.cocoa_parts import Part, join_labels
from dask_scd.engines.local.epochs import scd_epoch, sdca_epoch
from dask_scd.engines.local.sdca import weighted_dual
from dask_scd.kernels import cpu
from dask_scd.runtime.passes import sum_partials

# ----------------------------------------------------------------------- 1-D minimum


def line_minimum(slope_curvature, hi: float = np.inf) -> float:
    """argmin over γ ∈ [0, hi] of a convex φ given ``slope_curvature(γ) = (φ'(γ), φ''(γ))``
    (a right derivative at kinks). Newton steps safeguarded by bisection on a bracket of
    the sign change of φ'; 0 when φ'(0) ≥ 0 (no descent along the direction)."""
    slope, _ = slope_curvature(0.0)
    if not slope < 0.0:
        return 0.0
    lo = 0.0
    if not np.isfinite(hi):  # grow a bracket
        hi = 1.0
        for _ in range(200):
            if slope_curvature(hi)[0] >= 0.0:
                break
            lo, hi = hi, 2.0 * hi
        else:
            return hi
    elif slope_curvature(hi)[0] <= 0.0:
        return hi
    gamma = lo
    for _ in range(200):
        slope, curvature = slope_curvature(gamma)
        if slope == 0.0:
            return gamma
        if slope < 0.0:
            lo = gamma
        else:
            hi = gamma
        step = gamma - slope / curvature if curvature > 0.0 else np.nan
        if not lo < step < hi:
            step = 0.5 * (lo + hi)
        if abs(step - gamma) <= 1e-15 * max(abs(gamma), 1e-300) or hi - lo <= 1e-15 * hi:
            return step
        gamma = step
    return gamma


def _penalty_slope_curvature(problem, coef, direction, gamma) -> tuple[float, float]:
    """(d/dγ, d²/dγ²) of Σ_j g(θ_j + γΔθ_j), the L1 term by its right derivative."""
    moved = coef + gamma * direction
    slope = problem.l2 * obj.vdot(moved, direction)
    if problem.l1 > 0.0:
        sign = np.where(moved != 0.0, np.sign(moved), np.sign(direction))
        slope += problem.l1 * obj.vdot(sign, direction)
    return slope, problem.l2 * obj.vdot(direction, direction)


# ------------------------------------------------------------------------- the primal


def primal_solve(
    part: Part,
    y,
    margins,
    theta,
    intercept,
    problem,
    epochs: int,
    seed: int,
    with_intercept: bool,
    sigma: float = 1.0,
) -> dict:
    """(task) ``epochs`` epochs of coordinate descent on the part's columns (and on the
    intercept when ``with_intercept``), the margins of the other parts held fixed.

    ``sigma`` = K > 1 solves CoCoA+'s safe local problem min_Δ (1/K) f(ŷ + K X_kΔ) +
    g(θ_k + Δ), f the loss sum: by convexity f(ŷ + Σ_k X_kΔ_k) ≤ (1/K) Σ_k f(ŷ + K X_kΔ_k),
    so adding the K solutions never increases the objective (for the squared loss, the
    local quadratic term K times larger). In c = K(θ_k + Δ) it is the plain problem
    f(ŷ + X_k(c − Kθ_k)) + αρ‖c‖₁ + α(1−ρ)/(2K)‖c‖², which the kernel solves as it is.
    Returns the changes of the part's coefficients, of the intercept and of the margins.
    """
    m = part.matrix
    start_margins = np.asarray(margins, dtype=np.float64)
    local_margins = start_margins.copy()
    local_theta = sigma * np.asarray(theta, dtype=np.float64)
    local_intercept = np.array([sigma * float(intercept)])
    targets, weights = labels(y), row_weights(y)
    rng = np.random.default_rng(seed)
    k = m.n_major + int(with_intercept)
    for _ in range(epochs):
        order = rng.permutation(k)
        scd_epoch(
            cpu.scd_epoch,
            m,
            targets,
            local_margins,
            local_theta,
            local_intercept,
            order,
            problem,
            problem.l2 / sigma,
            part.sq_norms,
            part.cube_sums,
            weights,
        )
    # The direction's margins are X_kΔθ_k + Δb from the rounded Δθ_k, not the difference
    # of the kernel's margins: that loses the digits the two share (Δŷ ~ 1e-9 of ŷ ~ 1
    # keeps 7), which near the optimum turns the sign of the line's slope.
    delta = local_theta / sigma - theta
    delta_intercept = local_intercept[0] / sigma - intercept
    return {
        "coef": delta,
        "intercept": delta_intercept,
        "margins": m.scatter(delta) + delta_intercept,
    }


def primal_direction(*updates) -> dict:
    """(task) The aggregated direction: coefficient changes concatenated in part order, the
    margins' changes summed in part order."""
    return {
        "coef": np.concatenate([u["coef"] for u in updates]),
        "intercept": float(sum(u["intercept"] for u in updates)),
        "margins": sum_partials(*[u["margins"] for u in updates]),
    }


def primal_step(problem, y, margins, coef, direction: dict, aggregation: str, n_parts: int):
    """(task) γ for the direction, and the direction's p-sized part for the client.

    ``adaptive``: the exact minimizer of γ ↦ P(θ + γΔθ, b + γΔb) (closed form for ridge).
    """
    gamma = {"average": 1.0 / n_parts, "add": 1.0}.get(aggregation)
    if gamma is None:
        gamma = primal_gamma(problem, y, margins, coef, direction["coef"], direction["margins"])
    return {"gamma": float(gamma), "coef": direction["coef"], "intercept": direction["intercept"]}


def primal_gamma(problem, y, margins, coef, delta_coef, delta_margins) -> float:
    """argmin_γ≥0 (1/n) Σ v_i ℓ(y_i, ŷ_i + γΔŷ_i) + g(θ + γΔθ) (v = 1 without weights)."""
    y, weights = labels(y), row_weights(y)
    n = len(y)
    if problem.loss == "squared" and problem.l1 == 0.0:
        numerator = obj.weighted_sum(
            (margins - y) * delta_margins, weights
        ) + n * problem.l2 * obj.vdot(coef, delta_coef)
        denominator = obj.weighted_sum(
            delta_margins * delta_margins, weights
        ) + n * problem.l2 * obj.vdot(delta_coef, delta_coef)
        return max(-numerator / denominator, 0.0) if denominator > 0.0 else 0.0
    moved = delta_margins != 0.0
    y_m, z_m, u_m = y[moved], margins[moved], delta_margins[moved]
    v_m = None if weights is None else weights[moved]

    def slope_curvature(gamma):
        z = z_m + gamma * u_m
        slope = obj.weighted_sum(obj.loss_derivative(problem.loss, y_m, z) * u_m, v_m) / n
        curvature = (
            obj.weighted_sum(obj.loss_second_derivative(problem.loss, y_m, z) * (u_m * u_m), v_m)
            / n
        )
        pen_slope, pen_curvature = _penalty_slope_curvature(problem, coef, delta_coef, gamma)
        return slope + pen_slope, curvature + pen_curvature

    return line_minimum(slope_curvature)


def part_matvec(part: Part, theta) -> np.ndarray:
    """(task) X_k θ_k, the part's share of the margins."""
    return part.matrix.scatter(theta)


def primal_point(problem, y, intercept, *shares) -> dict:
    """(task) Fresh margins Σ_k X_k θ_k + b (in part order) and the dual point a of the
    certificate (−v∘ℓ'(ŷ) projected onto Σa = 0), with the certificate's row sums."""
    y, weights = labels(y), row_weights(y)
    margins = sum_partials(*shares) + intercept
    sums, a = margins_dual_point(problem, y, margins, weights)
    return {
        "margins": margins,
        "a": a,
        "loss_sum": sums["loss"],
        "dual_loss_sum": float(obj.dual_loss(problem.loss, y, a, weights).sum()),
        "margin_dot": obj.vdot(a, margins),
    }


def part_correlation(part: Part, dual_point) -> np.ndarray:
    """(task) X_kᵀa / n over the part's columns."""
    return part.matrix.dot(dual_point) / part.matrix.n_minor


def primal_certificate(problem, y, coef, point: dict, *correlations) -> obj.Certificate:
    """(task) The duality-gap certificate of (θ, b) from the parts' correlations."""
    y, weights = labels(y), row_weights(y)
    cert = obj.primal_certificate(
        problem,
        len(y),
        coef,
        point["loss_sum"],
        point["dual_loss_sum"],
        np.concatenate(correlations),
        point["margin_dot"],
    )
    return obj.rescaled_lasso_certificate(problem, cert, y, point["a"], coef, weights)


# --------------------------------------------------------------------------- the dual


def dual_start(part: Part, problem, intercept) -> np.ndarray:
    """(task) The part's first dual values: 0 for the box duals (liblinear's start), else
    −ℓ'(y_i, b) at θ = 0 with the best b (Σa = 0 there; the multiplier keeps it). With
    sample weights these are u = a/v, and 0 on the rows of weight 0 (their only dual value)."""
    y = part.y
    if problem.loss in ("hinge", "squared_hinge"):
        return np.zeros(len(y))
    a = -obj.loss_derivative(problem.loss, y, np.full(len(y), float(intercept)))
    if problem.loss == "logistic":  # the logistic dual is open at β ∈ {0, 1}
        a = np.clip(a * y, 1e-3, 1.0 - 1e-3) * y
    if part.weights is not None:
        a = np.where(part.weights > 0.0, a, 0.0)
    return a


def part_scatter(part: Part, dual_coef, scale: float) -> np.ndarray:
    """(task) scale · X_kᵀ a_k over the part's rows (a_k = v∘u_k with weights)."""
    return part.matrix.scatter(weighted_dual(dual_coef, part.weights)) * scale


def part_dual_sum(part: Part, dual_coef) -> float:
    """(task) Σa over the part's rows."""
    return obj.weighted_sum(dual_coef, part.weights)


def dual_solve(
    part: Part,
    dual_coef,
    coef,
    intercept,
    rho,
    dual_total,
    problem,
    alpha_n,
    epochs: int,
    seed: int,
    sigma: float = 1.0,
) -> dict:
    """(task) ``epochs`` SDCA epochs on the part's rows given the shared w = Xᵀa/(αn).

    The steps are those of the augmented Lagrangian of the intercept's constraint
    (:func:`dask_scd.kernels.cpu.sdca_epoch`, ``dual_total`` = Σa over all rows at the
    round's start). ``sigma`` > 1 solves CoCoA+'s safe local problem, whose quadratic
    terms are σ times larger: the same kernel with αn/σ, ρσ and the others' Σa/σ.
    With sample weights the values are u = a/v (the weighted epoch: each row's box and
    curvature scale with v_i). Returns the changes Δa_k (Δu_k with weights) and Δw_k =
    X_kᵀΔa_k/(αn), and the line's terms (:func:`dual_line_terms`).
    """
    m = part.matrix
    local = np.array(dual_coef, dtype=np.float64, copy=True)
    start_coef = np.asarray(coef, dtype=np.float64)
    local_coef = start_coef.copy()
    dual_sum = np.array([dual_total / sigma])
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(m.n_major)
        sdca_epoch(
            cpu.sdca_epoch,
            m,
            part.y,
            local,
            local_coef,
            order,
            problem.loss_code,
            alpha_n / sigma,
            part.sq_norms,
            part.weights,
            float(intercept),
            rho * sigma,
            dual_sum,
        )
    delta = local - dual_coef
    # Δw_k from the rounded Δa_k (not the difference of the kernel's w: see primal_solve).
    return {
        "coef": m.scatter(weighted_dual(delta, part.weights)) / alpha_n,
        "delta": delta,
        "line": dual_line_terms(problem.loss, part.y, dual_coef, delta, part.weights),
    }


def dual_summary(update: dict) -> dict:
    """(task) What of a part's dual update leaves its worker: Δw_k and the line's terms
    (Δa_k stays, for :func:`dual_apply`)."""
    return {"coef": update["coef"], "line": update["line"]}


def dual_line_terms(loss: str, y, dual_coef, delta, weights=None) -> dict:
    """The part's share of γ ↦ Σ_i d(a_i + γΔa_i), d = −ℓ*(−·), for the aggregating task.

    Quadratic duals (squared, hinge, squared hinge) travel as the scalars c1 = Σ d'(a)Δa,
    c2 = Σ d''(a)Δa² and the largest γ that keeps every β_i = a_i y_i in its domain; the
    logistic dual (entropies, not quadratic) as β and Δβ of the rows that moved.
    Σa and ΣΔa enter the multiplier term. With sample ``weights`` v the values are u = a/v
    and the function Σ_i v_i d(u_i + γΔu_i): the domain is u's (unweighted) box, c1 and c2
    weigh each row, and the logistic rows travel with their v.
    """
    beta, step = dual_coef * y, delta * y
    terms = {
        "sum": obj.weighted_sum(dual_coef, weights),
        "delta_sum": obj.weighted_sum(delta, weights),
        "limit": _domain_limit(loss, beta, step),
    }
    if loss == "logistic":
        moved = step != 0.0
        terms.update(
            beta=beta[moved], step=step[moved], weights=None if weights is None else weights[moved]
        )
        return terms
    if loss == "squared":  # d = ay − a²/2
        terms.update(
            c1=obj.weighted_sum((y - dual_coef) * delta, weights),
            c2=-obj.weighted_sum(delta * delta, weights),
        )
    elif loss == "hinge":
        terms.update(c1=obj.weighted_sum(step, weights), c2=0.0)
    else:  # squared hinge: d = β − β²/4
        terms.update(
            c1=obj.weighted_sum((1.0 - 0.5 * beta) * step, weights),
            c2=-0.5 * obj.weighted_sum(step * step, weights),
        )
    return terms


def _domain_limit(loss, beta, step) -> float:
    """The largest γ with every β + γΔβ in the dual domain (∞ for the squared loss)."""
    if loss == "squared":
        return np.inf
    limit = np.inf
    down = step < 0.0
    if down.any():
        limit = float(np.min(-beta[down] / step[down]))
    if loss in ("hinge", "logistic"):
        up = step > 0.0
        if up.any():
            limit = min(limit, float(np.min((1.0 - beta[up]) / step[up])))
    return max(limit, 0.0)


def dual_direction(*updates) -> dict:
    """(task) Δw summed in part order, and the parts' line terms in part order."""
    return {
        "coef": sum_partials(*[u["coef"] for u in updates]),
        "lines": [u["line"] for u in updates],
    }


def dual_step(
    problem, n_samples, coef, intercept, rho, direction: dict, aggregation: str, n_parts: int
) -> dict:
    """(task) γ for the direction, and Δw for the client.

    ``adaptive`` maximizes the augmented dual
    (1/n)[Σ d(a + γΔa) − b(S + γΔS) − ρ(S + γΔS)²/2] − (α/2)‖w + γΔw‖² over the γ that
    keep every a_i in its domain (S = Σa).
    """
    gamma = {"average": 1.0 / n_parts, "add": 1.0}.get(aggregation)
    if gamma is None:
        gamma = dual_gamma(
            problem, n_samples, coef, intercept, rho, direction["coef"], direction["lines"]
        )
    lines = direction["lines"]
    total = sum(t["sum"] for t in lines) + gamma * sum(t["delta_sum"] for t in lines)
    return {"gamma": float(gamma), "coef": direction["coef"], "dual_total": float(total)}


def dual_gamma(problem, n_samples, coef, intercept, rho, delta_coef, lines) -> float:
    """argmax_γ∈[0, limit] of the augmented dual along the direction (see :func:`dual_step`)."""
    n, alpha = float(n_samples), problem.alpha
    total = float(sum(t["sum"] for t in lines))
    delta_total = float(sum(t["delta_sum"] for t in lines))
    limit = min(t["limit"] for t in lines)
    w_dot, w_sq = obj.vdot(coef, delta_coef), obj.vdot(delta_coef, delta_coef)
    if problem.loss == "logistic":
        beta = np.concatenate([t["beta"] for t in lines])
        step = np.concatenate([t["step"] for t in lines])
        weighted_step = step  # v∘Δβ: the entropies' derivatives weigh each row
        if lines[0]["weights"] is not None:
            weighted_step = np.concatenate([t["weights"] for t in lines]) * step
        c1 = c2 = None
    else:
        c1 = float(sum(t["c1"] for t in lines))
        c2 = float(sum(t["c2"] for t in lines))

    def slope_curvature(gamma):
        """Of the negated objective (a convex function of γ)."""
        if c1 is None:
            b = np.clip(beta + gamma * step, 1e-300, 1.0 - 1e-16)
            d1 = obj.vdot(np.log((1.0 - b) / b), weighted_step)
            d2 = -float(np.sum(weighted_step * step / (b * (1.0 - b))))
        else:
            d1, d2 = c1 + gamma * c2, c2
        moved_total = total + gamma * delta_total
        slope = (d1 - intercept * delta_total - rho * moved_total * delta_total) / n
        slope -= alpha * (w_dot + gamma * w_sq)
        curvature = (d2 - rho * delta_total * delta_total) / n - alpha * w_sq
        return -slope, -curvature

    if c1 is not None and np.isinf(limit):  # the squared loss: closed form
        slope0, curvature = slope_curvature(0.0)
        return max(-slope0 / curvature, 0.0) if curvature > 0.0 else 0.0
    if problem.loss == "logistic" and np.isfinite(limit):
        limit *= 1.0 - 1e-12  # the entropies' slope is infinite on the boundary
    return line_minimum(slope_curvature, limit)


def dual_apply(dual_coef, update: dict, step: dict) -> np.ndarray:
    """(task) a_k + γΔa_k (u_k + γΔu_k with weights)."""
    return dual_coef + step["gamma"] * update["delta"]


def dual_sign_sums(part: Part, dual_coef) -> dict:
    """(task) Σ of the positive and of the negative dual values a (the projection's input;
    a = v∘u has u's signs, so the same scales shrink u)."""
    a = weighted_dual(dual_coef, part.weights)
    return {"pos": float(a[a > 0].sum()), "neg": float(a[a < 0].sum())}


def dual_projection(problem, *sums) -> tuple[float, float]:
    """(task) The scales that project a onto Σa = 0 (shrinking one sign's values)."""
    total = {"pos": sum(s["pos"] for s in sums), "neg": sum(s["neg"] for s in sums)}
    return obj.dual_scales(problem, total)


def projected(dual_coef, scales) -> np.ndarray:
    return np.where(dual_coef > 0, dual_coef * scales[0], dual_coef * scales[1])


def part_projected_scatter(part: Part, dual_coef, scales, alpha_n) -> np.ndarray:
    """(task) X_kᵀ a'_k/(αn) for the projected a'."""
    dual = weighted_dual(projected(dual_coef, scales), part.weights)
    return part.matrix.scatter(dual) / alpha_n


def part_margins(part: Part, coef) -> np.ndarray:
    """(task) X_k w over the part's rows."""
    return part.matrix.dot(coef)


def dual_certificate(problem, coef, intercept_start, scales, n_parts, *arrays) -> dict:
    """(task) The SDCA certificate of the projected a' and w' = Xᵀa'/(αn), with w' and the
    best intercept for it; ``arrays`` are the parts' labels (:func:`part_labels`), then
    their a_k (u_k with weights), then their X_k w', each in part order."""
    K = n_parts
    joined = join_labels(*arrays[:K])
    y, weights = labels(joined), row_weights(joined)
    dual_coef = weighted_dual(projected(np.concatenate(arrays[K : 2 * K]), scales), weights)
    margins = np.concatenate(arrays[2 * K :])
    intercept = 0.0
    if problem.fit_intercept:
        intercept = obj.optimal_intercept(
            problem.loss, y, margins, start=intercept_start, weights=weights
        )
    cert = obj.sdca_certificate(problem, y, dual_coef, coef, margins + intercept, weights)
    return {"certificate": cert, "intercept": float(intercept), "coef": coef}


def part_labels(part: Part):
    """(task) The part's labels (with their sample weights, when it has some)."""
    return part.y if part.weights is None else WeightedLabels(part.y, part.weights)


def dual_total(*sums) -> float:
    """(task) Σa over every part (:func:`part_dual_sum`), in part order."""
    return float(sum(sums))


def initial_intercept(problem: obj.Problem, y) -> float:
    """(task) The best intercept for θ = 0 (weighted when ``y`` carries weights)."""
    return float(obj.zero_intercept(problem, labels(y), row_weights(y)))
