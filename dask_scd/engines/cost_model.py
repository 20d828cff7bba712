"""The cost model of ``solver="auto"`` in memory: the passes over X each in-memory engine
is predicted to need to a tight gap, from the problem and the data's statistics. The
registry (:func:`dask_scd.engines.registry.resolve`) picks the engine of the fewest, and
the plan reports them (``extras_["plan"]["predicted_passes"]``).
"""

from __future__ import annotations

import scipy.sparse as sp

from dask_scd.engines.coarse_level import MAX_BLOCKS
from dask_scd.objectives import Problem

# Above this many features H = XᵀX/n costs more than the epochs it saves (n·p²/2 flops
# against ~10–30 SCD epochs of n·p) and no longer fits in cache.
GRAM_MAX_FEATURES = 512

# The cost model of ``auto`` in memory, in passes over the stored values of X. The
# constants are the engines' measured pass counts (docs/engines/newton.md, local.md,
# benchmarks/results/peers.md): SDCA needs about 10·κ epochs on a smooth L2 problem whose
# dual conditioning is κ = mean‖x_i‖²/(αn) (and at least a few); a Newton step costs its
# curvature plus ~3 passes (gradient with certificate, line search, extrapolation), and
# 6–8 steps reach 1e-9 at any α (L2); without XᵀDX a step costs ~9 passes of
# conjugate-gradient products (one-hot 100k × 20k: 5 steps, 45 passes). A dense BLAS Gram
# runs ~8× faster per flop than a kernel's pass.
_SDCA_EPOCHS_PER_KAPPA = 10.0
_SDCA_MIN_EPOCHS = 5.0
# A row's scalar work, against a stored value's (one core, ns): SDCA's dual step is a
# safeguarded Newton iteration for the logistic (~390 a row, measured when it ran in β;
# ~190–280 in the logit since, left at 390 until auto's choices are re-measured on the
# peers' rows) and one clipped step for the quadratic duals (~60); a smooth Newton
# step's derivatives, certificate and line search cost ~90 a row; a stored value costs
# ~0.5 in a pass over dense rows, ~1.5 over sparse ones (rows of 2 to 1000 values).
# Where rows are short the rows dominate:
# logistic L2 at κ = 0.5–2.5 on dense 200 × 50, 2000 × 50 and 1000 × 10, SDCA 1.9 / 11.7
# / 5.3 ms against Newton's 1.2 / 4.4 / 2.0 ms; one-hot 4000 × 10000 (20 values a row) at
# α = 1, SDCA 2.7 (logistic) / 1.6 (squared) ms against Newton's 3.7 / 3.2 ms.
_SDCA_ROW_NS = {"logistic": 390.0, "squared": 60.0}
_NEWTON_ROW_NS = 90.0
_VALUE_NS = {"dense": 0.5, "sparse": 1.5}
_NEWTON_STEPS = 7.0
# The fixed cost of a Newton step's Python (bookkeeping, the calls of its kernels), and of
# an epoch's call and gap in the kernel's form (one core, ns; benchmarks/results/call_cost.md).
_STEP_CALL_NS = 150_000.0
_EPOCH_CALL_NS = 10_000.0
# The logistic dual step in the kernel's epochs, measured there (dense 200 × 500, one
# core: 28 µs for 200 steps, 45–50 µs an epoch with K's rows and the gap).
_KERNEL_DUAL_ROW_NS = {"logistic": 200.0}
_NEWTON_CG_PASSES = 9.0
_RIDGE_CG_PASSES = 30.0  # one CG solve of ridge to 1e-6..1e-9 (one-hot 1M × 100k: 27–36)
_NEWTON_GRAM_MAX = 2000  # above this many columns the Newton engine never forms XᵀDX
# A BLAS Gram of dense rows runs this many times faster per flop than a pass of the kernels.
BLAS_SPEEDUP = 8.0
# A ridge whose XᵀX and Cholesky cost at most this many flops (about a millisecond) is
# solved by Newton's one exact step (to rounding) rather than to tol by an iterative
# engine: the time is the same, the answer exact (a weighted fit then equals the fit of
# its repeated rows to rounding, as scikit-learn's direct solvers give).
_EXACT_FLOPS = 1e6
# Primal SCD on an L2 problem: epochs grow with the primal conditioning, which the data's
# statistics do not give cheaply; it is the fallback where the others do not apply.
_SCD_EPOCHS = 1000.0


def predicted_passes(problem: Problem, data) -> dict[str, float]:
    """Predicted passes over X to a tight gap for each in-memory engine that applies.

    - squared loss with n ≥ 4p and p ≤ 512: "gram" (one pass builds XᵀX/n; after it every
      step and certificate is O(p)) — cheapest whenever it applies, except for L1 on pure
      blocks, where Newton's block shifts win;
    - the hinge (L2): "sdca" at ≈ 120·κ^¾ epochs against "newton" (a smoothed hinge, its
      width driven to zero) at ≈ 60 steps of about one pass when p + 1 ≤ 2000
      (:func:`_hinge_passes`);
    - L2 with a smooth loss: "sdca" at ≈ 10·κ epochs against "newton" at ≈ 10 steps of
      its curvature (Cholesky of XᵀDX when p ≤ 2000 and cheaper than conjugate gradients),
      ≈ 7 steps (one for the squared loss); and "block_scd" (≈ 25 passes) on large
      one-hot fields (:func:`_block_steps_pay`);
    - L1 / elastic net: "newton" when the loss is not squared, at any width (its
      working sets hold the support, not p: measured at the rule), for the squared
      loss's lasso with n ≤ p ≤ 2000
      (:func:`_lasso_without_rank`), or when X has pure blocks (one-hot fields: the block shifts of its
      inner solver, :func:`dask_scd.engines.newton.l1_model.block_shift`, take the directions
      coordinate descent crawls along; Criteo-like 200k × 611k logistic L1: 11 steps to
      3e-11 against SCD's 94 epochs short of 1e-4); else "scd" (working sets with
      extrapolation, the Gram engine's method for the squared loss).
    """
    n, p = data.shape
    costs = {}
    gram_shape = problem.loss == "squared" and p <= GRAM_MAX_FEATURES and n >= 4 * p
    fields = False
    if gram_shape:
        # On one-hot fields an L1 problem's coordinate descent creeps along whole-field
        # shifts (Adult, lasso at 1e-3·alpha_max without intercept: 1,631 Gram epochs,
        # 0.12 s, against one Newton step, 0.02 s, whose inner solver moves whole blocks).
        # Elsewhere the Gram engine wins, so the fields are detected (:func:`_has_fields`:
        # one pass over X on Adult) rather than Newton taken for any sparse X: on
        # sparse random X without fields (20000 × 300 at 5 %, 5000 × 100 binary at 10 %,
        # 50000 × 500 at 1 %, 3000 × 60 at 30 %; lasso and l1_ratio 0.5, 0.5 to 1e-3 of
        # alpha_max, with and without intercept, tol 1e-8, one thread) Newton took 1.56x
        # the Gram engine's time in geometric mean over 64 fits, up to 7x.
        fields = problem.l1_ratio > 0 and _has_fields(data)
        costs["gram"] = 3.0 if fields else 1.0
    if problem.loss == "hinge":
        return _hinge_passes(problem, data)
    if problem.l1_ratio > 0:
        # Non-squared L1 beyond 2000 columns, proximal Newton (working sets) against SCD:
        # CPU time to a gap of 1e-8, one thread, logistic, with and without intercept, at
        # 0.5 / 0.1 / 0.05 / 0.01 of alpha_max (benchopt's correlated generator, ρ = 0.6),
        # Newton/SCD: dense 500 × 5000 1.14–1.23 / 0.38–0.43 / 0.28–0.33 / 0.14–0.17;
        # dense 1000 × 10000 1.86–2.02 / 0.32–0.39 / 0.26–0.29 / 0.17–0.18; sparse
        # 2000 × 20000 (2 % stored) 0.10 / 0.19–0.22 / 0.26–0.29 / 0.40–0.41; sparse
        # 5000 × 50000 (0.5 %) 0.12–0.13 / 0.31–0.39 / 0.38–0.41 / 0.54–0.56. SCD wins only
        # at a strong penalty on dense rows (a support of ~100), by at most 2x.
        # In the Gram engine's range Newton takes the L1 problems of one-hot fields; the
        # others it would lose to the Gram engine (1 against 2), so blocks that are not
        # fields (a colouring of X) are not looked for there.
        if (
            problem.loss != "squared"
            or (fields if gram_shape else _has_blocks(data))
            or _lasso_without_rank(problem, n, p)
        ):
            costs["newton"] = 2.0
        costs["scd"] = 3.0
        return costs
    kappa = data.mean_row_sq_norm / (problem.alpha * n)
    # A row's scalar work in passes: rows per stored value, times its cost in stored values
    rows = n / max(data.nnz, 1) / _VALUE_NS["sparse" if sp.issparse(data.X) else "dense"]
    epoch = 1.0 + rows * _SDCA_ROW_NS.get(problem.loss, _SDCA_ROW_NS["squared"])
    costs["sdca"] = max(_SDCA_MIN_EPOCHS, _SDCA_EPOCHS_PER_KAPPA * kappa) * epoch
    step = _NEWTON_CG_PASSES
    cholesky = float("inf")  # flops of XᵀDX and its factor (only where Newton forms them)
    if p <= _NEWTON_GRAM_MAX:
        cholesky = data.gram_flops + p**3 / 3.0
        step = min(step, 3.0 + cholesky / (BLAS_SPEEDUP * max(data.nnz, 1)))
    if problem.loss == "squared":  # one exact step: Cholesky, or one CG solve to tol
        costs["newton"] = step if step < _NEWTON_CG_PASSES else _RIDGE_CG_PASSES
        if cholesky <= _EXACT_FLOPS:
            costs["newton"] = 0.0  # a small ridge: solved exactly, whatever tol
    else:
        costs["newton"] = _NEWTON_STEPS * (step + rows * _NEWTON_ROW_NS)
    costs["scd"] = _SCD_EPOCHS
    if _block_steps_pay(data):
        costs["block_scd"] = _BLOCK_PASSES
    return costs


def kernel_dual_ns(problem: Problem, n: int, nnz: int, dense: bool) -> tuple[float, float]:
    """(an epoch of SDCA in the kernel's form, Newton's kernel steps from θ = 0), in ns,
    for an L2 problem with n rows, ``nnz`` stored values (:mod:`dask_scd.engines.newton.kernel_step`).

    An epoch reads K (n² values), takes n dual steps and reads its gap; a Newton step
    factors the n × n system at BLAS speed, makes its two passes and ~3 more (gradient
    with certificate, line search, extrapolation), and its bookkeeping;
    :data:`_NEWTON_STEPS` of them.
    """
    row_ns = _KERNEL_DUAL_ROW_NS.get(problem.loss, _SDCA_ROW_NS["squared"])
    epoch = n * n * _VALUE_NS["dense"] + n * row_ns + _EPOCH_CALL_NS
    factor = n**3 / 3.0 / BLAS_SPEEDUP * _VALUE_NS["dense"]
    passes = 5.0 * nnz * _VALUE_NS["dense" if dense else "sparse"]
    return epoch, _NEWTON_STEPS * (factor + passes + n * _NEWTON_ROW_NS + _STEP_CALL_NS)


# Block SCD in memory (dask_scd.engines.block.block_memory) on one-hot fields, L2: about 6–30
# epochs of ~2 passes (a fused pass over the blocks, the certificate), whatever the
# columns' frequencies; Newton's conjugate gradients need more products where many
# columns are rare (their curvature is ~α), and few where columns are frequent. So the
# median count of a column's stored values decides, not their mean (which the frequent
# columns of a Zipf field dominate). Measured (make_onehot, logistic at α = 1/n and
# 0.1/n, certified 1e-6, 2 threads; one thread in brackets), seconds, block SCD against
# Newton: Criteo-like 611k columns, 1M rows (median 3 values a column): 5.3 / 9.3
# against 6.6 / 13.8 [9.7 / 15.9 against 8.7 / 19.8]; 6M rows: 34.4 against 57.5 at 1/n;
# 1M × 100k (median 45): 3.0 / 3.3 against 2.3 / 2.5 [5.1 against 2.5 at 1/n]; 2M × 3k
# (median 13,000): 4.5 / 4.8 against 2.9 / 2.9. Below ~8M stored entries its set-up and
# per-block steps cost more than they save: 300k × 9.4k (3M): 0.40–0.48 against
# 0.35–0.39; 200k × 20k (2M): 0.39–0.46 against 0.33–0.36.
_BLOCK_PASSES = 25.0
_BLOCK_MIN_ENTRIES = 8_000_000
_BLOCK_MAX_MEDIAN_COUNT = 20


def _block_steps_pay(data) -> bool:
    """Whether block SCD in memory is a candidate: unweighted sparse X of ≥ 8M stored
    entries, wider than Newton's Gram, whose median column holds at most 20 values, in
    one-hot fields (pure blocks, detected last: it reads X)."""
    p = data.shape[1]  # (dense X has no pure blocks: _has_fields says no without a pass)
    return (
        not data.weighted
        and data.nnz >= _BLOCK_MIN_ENTRIES
        and p > _NEWTON_GRAM_MAX
        and data.median_column_count <= _BLOCK_MAX_MEDIAN_COUNT
        and _has_fields(data)
    )


# The hinge: SDCA's shrinking epochs to 1e-9 grow as κ^¾ rather than κ (Adult, κ = 0.14 /
# 1.4 / 14 / 140 at C = 0.01 / 0.1 / 1 / 10: 26 / 171 / 974 / > 1000 epochs; dense
# 20000 × 50 at C = 0.1: 346; one-hot 20000 × 10000 at C = 0.1: 111). The smoothed Newton
# method takes 30–90 steps (Adult C = 0.01 to 10, dense), each about one pass and one
# SDCA epoch in time (gradient with certificate, XΔ, the band's Gram; the exact line
# search is O(n)), plus the (p + 1)³/3 flops of the band's Cholesky.
_HINGE_SDCA_EPOCHS_PER_KAPPA = 120.0
_HINGE_SDCA_EXPONENT = 0.75
_HINGE_NEWTON_STEPS = 60.0


def _hinge_passes(problem: Problem, data) -> dict[str, float]:
    """Predicted passes of the hinge's engines: "sdca", and "newton" while p + 1 ≤ 2000
    (above, its band system goes to conjugate gradients, whose iterations grow with the
    band: one-hot 20000 × 10000 took 40–280 steps of 60–200 passes each)."""
    n, p = data.shape
    kappa = data.mean_row_sq_norm / (problem.alpha * n)
    epochs = _HINGE_SDCA_EPOCHS_PER_KAPPA * kappa**_HINGE_SDCA_EXPONENT
    costs = {"sdca": max(_SDCA_MIN_EPOCHS, epochs)}
    if p + 1 <= _NEWTON_GRAM_MAX:
        cholesky = (p + 1) ** 3 / 3.0 / (BLAS_SPEEDUP * max(data.nnz, 1))
        costs["newton"] = _HINGE_NEWTON_STEPS * (1.0 + cholesky)
    return costs


def _lasso_without_rank(problem: Problem, n: int, p: int) -> bool:
    """The lasso (no L2 part) of the squared loss with n ≤ p ≤ 2000 (Newton's working-set
    Gram fits): near its interpolating end coordinate descent crawls, X having no full
    column rank (dense, at 10⁻³·alpha_max, tol 1e-6: 100 × 1000, 300 × 400 and
    500 × 1000 stopped at 1000 SCD epochs at gaps 8e-4 to 1e-1, as did the Gram engine;
    proximal Newton, whose inner solves run on working sets, certified 1e-6 in 35–107
    steps, 0.2–1.4 s). Wider (1000 × 5000: SCD stalled at 6e-3 in 2.3 s, Newton took
    17.7 s) SCD stays, and ``fit`` hands it over to Newton where it stops short
    (dask_scd.engines.planner.fit_hands_over), as it does where rank is missing with
    n > p. The elastic net's L2 part keeps SCD converging (266–722 epochs there)."""
    return problem.loss == "squared" and problem.l2 == 0.0 and n <= p <= _NEWTON_GRAM_MAX


def _has_blocks(data) -> bool:
    """Whether sparse X has 2 to 256 pure blocks (detected once, kept for the engine)."""
    blocks = getattr(data, "pure_blocks", None)
    return blocks is not None and 2 <= len(blocks) <= MAX_BLOCKS


def _has_fields(data) -> bool:
    """Whether X's pure blocks are one-hot fields: 2 to 256 blocks of two columns or more
    on average (a sparse X of unrelated columns splits into blocks of one). Asked first of
    the pure ranges of consecutive columns (one pass over X: where one-hot encoders put a
    field's columns), then of the greedy colouring's blocks (a transpose of X and the
    colouring; Adult: 0.3 against 1.3 ms), which find fields in any column order."""
    p = data.shape[1]
    return _are_fields(getattr(data, "contiguous_blocks", None), p) or _are_fields(
        getattr(data, "pure_blocks", None), p
    )


def _are_fields(blocks, p: int) -> bool:
    """Whether ``blocks`` (or None) are 2 to 256 blocks of p columns, two or more on
    average."""
    return blocks is not None and 2 <= len(blocks) <= MAX_BLOCKS and 2 * len(blocks) <= p
