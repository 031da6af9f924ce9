"""Orthogonalization by odd matrix polynomials (Newton-Schulz / polar iterations).

For a matrix ``G = U S V^T`` (thin SVD) the orthogonal polar factor ``U V^T``
is the steepest-descent direction under the spectral norm (the RMS->RMS
dual map, docs/math.md section 3). It is approximated without an SVD by
iterating an odd quintic on the Frobenius-normalized matrix::

    X_0 = G / (||G||_F * safety)                 (so every sigma_i(X_0) <= 1)
    A_k = X_k X_k^T,   X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k

An odd polynomial acts on the singular values only, so after ``K`` steps the
result is ``U p_K(...p_1(S)) V^T``. Coefficient schedules:

* :data:`MUON_QUINTIC` ``(3.4445, -4.7750, 2.0315)`` repeated 5 times
  (Jordan 2024). Fast initial growth, but it does not converge: singular
  values end up roughly in ``[0.7, 1.2]``.
* :func:`polar_express_coefficients`: a different minimax-optimal quintic per
  step (Amsel et al. 2025), generated here by a Remez (equioscillation) solve
  from pinned parameters; converges to 1 (8 steps give ``|sigma - 1| < 0.01``
  in float32 for singular values above ``l``).
* :data:`YOU_COEFFICIENTS` (``'you'``, optax's ``'dion'``): You's 5-step set;
* ``'polar_express_schatten'``: the Polar Express construction on
  ``[3e-3, 1]``, 4 steps, for the Schatten-4-normalized start;
* ``'power3'`` (:data:`POWER3_COEFFICIENTS`): 3 steps for the ``'power'``
  start (normalized by a power-iteration estimate of the largest singular
  value);
* ``'power4'`` (:data:`POWER4_COEFFICIENTS`): 4 steps for the same start
  (the bfloat16 default, :func:`power4_schedule`);
* any user table ``[(a, b, c), ...]`` or a user function replacing the whole
  iteration.

Implementation notes (see :func:`newton_schulz`): the iteration is batched
over leading axes; the Gram product is formed on the short side of each
matrix (``X X^T`` when wide, ``X^T X`` when tall) with ``dot_general``
dimension numbers instead of materialized transposes; for clearly
rectangular matrices in float32 (and float16, with restarts) a Gram-space
variant iterates on the ``m x m`` Gram matrix and multiplies by ``X`` once
per segment. The start can be scaled by the Frobenius norm, the Schatten-4
norm or AOL's diagonal (``preconditioning=``; docs/math.md, "Orthogonalization
at fewer flops"), and the default coefficients depend on the compute dtype
and the shape, decided in :func:`auto_schedule` alone (its table is rendered
into docs/guide.md, "Coefficients").

Precision on accelerators (see ``resolve_precision``,
``newton_schulz_method``): the default compute dtype is bfloat16 on
GPU/TPU and float32 elsewhere; float32 compute runs its matmuls at
``Precision.HIGHEST`` unless told otherwise, so float32 results agree across
backends; ``method='auto'`` picks the Gram-space variant only at that
precision or in float16 (with restarts, ``gram_restarts``), and the bfloat16
default schedule (:func:`power4_schedule`) runs it on rectangular matrices
with one restart.

References:
  Jordan et al. (2024), "Muon: An optimizer for hidden layers in neural
  networks" (modded-nanogpt).
  Amsel, Persson, Musco, Gower (2025), "The Polar Express: Optimal Matrix Sign
  Methods and Their Application to the Muon Algorithm", arXiv:2505.16932.
  Turbo-Muon (2025), arXiv:2512.04632 (AOL preconditioning); Dao-AILab's
  gram-newton-schulz (Gram-space restarts).
  docs/math.md section 4.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "HALF_PRECISION_RESTART_EVERY",
    "MUON_QUINTIC",
    "AUTO_GRAM_ASPECT",
    "POWER3_COEFFICIENTS",
    "POWER4_COEFFICIENTS",
    "POWER_GUARD",
    "POWER_ITERATIONS",
    "POWER_SAFETY",
    "POWER_STARTS",
    "POLAR_EXPRESS_CUSHION",
    "POLAR_EXPRESS_L",
    "POLAR_EXPRESS_SAFETY",
    "PRECONDITIONINGS",
    "SCHATTEN_POLAR_EXPRESS_L",
    "YOU_COEFFICIENTS",
    "auto_coefficients",
    "auto_schedule",
    "power4_schedule",
    "default_preconditioning",
    "gram_restarts",
    "newton_schulz",
    "newton_schulz_flops",
    "newton_schulz_method",
    "optimal_quintic",
    "polar_express_coefficients",
    "resolve_coefficients",
    "resolve_precision",
    "user_function_dtype",
]

Triple = tuple[float, float, float]

#: The original Muon quintic (Jordan 2024), used for 5 steps.
MUON_QUINTIC: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)

#: You's 5-step schedule (Jiacheng You, 2025; Dion's and optax's ``'dion'``):
#: a different quintic per step, tuned for fast growth of small singular
#: values, ending in ``[0.68, 1.13]`` like the quintic.
YOU_COEFFICIENTS: tuple[Triple, ...] = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)

#: Pinned Polar Express parameters of the published 8-step table
#: (lower end of the singular-value interval, cushion, safety factor).
POLAR_EXPRESS_L: float = 1e-3
POLAR_EXPRESS_CUSHION: float = 0.02407327424182761
POLAR_EXPRESS_SAFETY: float = 1.01

#: Lower end of the interval of :data:`'polar_express_schatten'`: 1e-2 of the
#: largest singular value times the smallest ``sigma_max(X_0)`` the Schatten-4
#: normalization gives a ``768 x 768`` Gaussian matrix (about 0.3).
SCHATTEN_POLAR_EXPRESS_L: float = 3e-3

#: Preconditionings of the iteration's start (see :func:`newton_schulz`).
PRECONDITIONINGS = ("frobenius", "schatten", "aol", "power")

#: Power iterations on the first step's ``A^2`` that estimate the largest
#: singular value for the ``'power'`` start (matrix-vector products only).
#: The Rayleigh quotient is a lower bound on ``lambda_max(A^2) = sigma_max^4``
#: that approaches it geometrically in the eigenvalue ratio below the top, so
#: the slowest case is a matrix without a spectral gap (a Gaussian one);
#: :data:`POWER_SAFETY` covers the undershoot left after these iterations of
#: the :data:`POWER_STARTS` starts (docs/math.md, "Orthogonalization at fewer
#: flops"; the figures are in docs/lab_log.md).
POWER_ITERATIONS: int = 8

#: Start vectors of the power iteration (fixed pseudo-random, iterated side by
#: side; the largest Rayleigh quotient is kept). One start misses a matrix
#: whose top eigenvector it is nearly orthogonal to: the estimate then falls
#: below ``sigma_max / POWER_SAFETY``, ``sigma_1(X_0) > 1`` and the steep
#: ``'power'`` tables blow that value up within a step or two (a bfloat16
#: training run that diverged this way with one start: docs/lab_log.md). With
#: ``p`` independent starts such a miss needs all ``p`` overlaps that small
#: (about ``(2e-3)^p`` per matrix); :data:`POWER_GUARD` catches the rest.
POWER_STARTS: int = 4

#: The ``'power'`` start's guard: a result with ``||Y||_F^2 > POWER_GUARD^2 *
#: min(m, n)`` (the top of the ``[0.6, 1.25]`` band on every singular value),
#: or not finite, is replaced by the start ``X_0`` itself (its singular values
#: ``sigma_i / N``: a scaled gradient, finite and in the gradient's direction).
#: It costs one reduction per matrix and only acts on an estimate that
#: missed by more than the tables tolerate.
POWER_GUARD: float = 1.25

#: The ``'power'`` start divides by ``min(||X||_{S_8}, POWER_SAFETY * estimate)``:
#: an underestimate of sigma_max by up to this factor still gives
#: ``sigma_max(X_0) <= 1``.
POWER_SAFETY: float = 1.05

#: ``'power3'``: three quintics for the ``'power'`` start. They maximize, in
#: float64, the worst log-distance ``min(log(p(x) / 0.6), log(1.25 / p(x)))``
#: of the composed polynomial from the band ``[0.6, 1.25]`` over ``x`` in
#: ``[1e-2 / POWER_SAFETY, 1.03]`` (singular values down to 1e-2 of the
#: largest after a normalization up to ``POWER_SAFETY`` too large, and up to
#: 3% too small), by Nelder-Mead from the 3-step Polar Express table on that
#: interval with its last row centred in the band. The composition maps that
#: interval into ``[0.638, 1.176]`` (log-margin 0.061; the Polar Express start
#: had 0.045); above ``x = 1.04`` it leaves the band (docs/math.md,
#: "Orthogonalization at fewer flops").
POWER3_COEFFICIENTS: tuple[Triple, ...] = (
    (8.033912339860501, -21.77917737021943, 14.932846370798163),
    (3.560245066179914, -2.5279315483912725, 0.47068370925965963),
    (2.4876687825809993, -1.8771767599966456, 0.4297615808977452),
)

#: ``'power4'``: four quintics for the ``'power'`` start, the Polar Express
#: construction (:func:`polar_express_coefficients`, cushion 0.1, no safety
#: factor) on ``[1e-2 / (POWER_SAFETY * 1.03), 1]`` with every polynomial's
#: argument divided by 1.03, so that it covers ``[1e-2 / POWER_SAFETY, 1.03]``
#: like :data:`POWER3_COEFFICIENTS`: float64 range ``[0.938, 1.027]`` there.
#: The bfloat16 default (``power4_schedule``).
POWER4_COEFFICIENTS: tuple[Triple, ...] = (
    (7.228817058908975, -16.881974838788487, 11.156013182177627),
    (3.4095806650043747, -2.1350918062772806, 0.37832225857796686),
    (2.7552838284777317, -1.9397317443162336, 0.40412588137076894),
    (1.9548526773186243, -1.2780350181549587, 0.336356883098494),
)

#: ``power4_schedule`` (the bfloat16 default): matrices with ``max(m, n) >=
#: AUTO_GRAM_ASPECT * min(m, n)`` run ``'power4'`` in Gram space with one restart.
AUTO_GRAM_ASPECT: float = 2.0

#: The Gram-space iteration with 10 mantissa bits (float16, TensorFloat-32)
#: restarts from ``X`` every this many steps (``gram_restarts``; the bands it
#: holds: docs/benchmarks.md, "Orthogonalization methods").
HALF_PRECISION_RESTART_EVERY: int = 2

Coefficients = str | Triple | Sequence[Triple] | np.ndarray | Callable[[jax.Array], jax.Array]


# --------------------------------------------------------------------------
# Polar Express: minimax-optimal odd quintics by equioscillation.
# --------------------------------------------------------------------------
def optimal_quintic(l: float, u: float) -> Triple:
    """The odd quintic ``p(x) = a x + b x^3 + c x^5`` minimizing ``max |1 - p|`` on ``[l, u]``.

    Remez exchange: the optimum equioscillates at four points
    ``l < q < r < u`` (``q, r`` the critical points of ``p``) with
    ``1 - p = E, -E, E, -E``. Solve the 4x4 linear system for ``(a, b, c, E)``,
    move ``q, r`` to the roots of ``p'(x) = a + 3 b x^2 + 5 c x^4``, repeat
    until ``E`` is stationary (float64).

    Args:
      l: lower end of the interval, ``0 < l <= u``.
      u: upper end.

    Returns:
      ``(a, b, c)`` as Python floats.
    """
    if not 0 < l <= u:
        raise ValueError(f"optimal_quintic needs 0 < l <= u, got l={l}, u={u}")
    if l / u >= 1 - 5e-6:
        # The interval is a point up to float64 accuracy of the solve: the
        # equioscillating polynomial is the convergent Newton-Schulz quintic.
        return (15 / 8) / u, (-10 / 8) / u**3, (3 / 8) / u**5
    q, r = (3 * l + 1) / 4, (l + 3) / 4  # exact as l -> u
    err, old_err = math.inf, None
    for _ in range(100):
        if old_err is not None and abs(old_err - err) <= 1e-15:
            break
        old_err = err
        pts = np.array([l, q, r, u], dtype=np.float64)
        lhs = np.stack([pts, pts**3, pts**5, np.array([1.0, -1.0, 1.0, -1.0])], axis=1)
        a, b, c, err = np.linalg.solve(lhs, np.ones(4))
        disc = math.sqrt(9 * b * b - 20 * a * c)
        q, r = np.sqrt((-3 * b + np.array([-disc, disc])) / (10 * c))
    return float(a), float(b), float(c)


@functools.lru_cache(maxsize=64)
def polar_express_coefficients(
    num_steps: int = 8,
    *,
    l: float = POLAR_EXPRESS_L,
    cushion: float = POLAR_EXPRESS_CUSHION,
    safety: float = POLAR_EXPRESS_SAFETY,
) -> tuple[Triple, ...]:
    """Polar Express schedule: one minimax-optimal quintic per step.

    Starting from the interval ``[l, u] = [l, 1]`` that holds every singular
    value of the normalized matrix, step ``k`` takes the optimal quintic on
    ``[max(l, cushion * u), u]`` (:func:`optimal_quintic`; the cushion keeps
    early steps from over-fitting tiny singular values), rescales it so that
    ``p(l)`` and ``p(u)`` are centred on 1 (``p <- 2 p / (p(l) + p(u))``), and
    maps the interval to ``[p(l), 2 - p(l)]``. The interval shrinks to 1, and
    the last polynomials tend to the convergent ``(15/8, -10/8, 3/8)``.
    Finally every polynomial but the last is divided by the safety factor
    ``s`` in its argument, ``(a, b, c) -> (a / s, b / s^3, c / s^5)``, a
    guard against round-off pushing singular values above the interval.

    With the pinned defaults and ``safety=1`` the 8-step table is the
    published one (first row ``(8.28721201814563, -23.595886519098837,
    17.300387312530933)``).

    Args:
      num_steps: number of polynomials.
      l: lower end of the initial singular-value interval (values below it
        still grow, but without the minimax guarantee).
      cushion: relative floor of the interval each step optimizes for.
      safety: safety factor ``s >= 1`` (1 disables it).

    Returns:
      A tuple of ``num_steps`` ``(a, b, c)`` triples of Python floats.

    References:
      Amsel, Persson, Musco, Gower (2025), "The Polar Express", Algorithm 1.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if not 0 < l < 1:
        raise ValueError(f"l must be in (0, 1), got {l}")
    if not 0 <= cushion < 1:
        raise ValueError(f"cushion must be in [0, 1), got {cushion}")
    if safety < 1:
        raise ValueError(f"safety must be >= 1, got {safety}")
    lo, hi = float(l), 1.0
    table = []
    for _ in range(num_steps):
        a, b, c = optimal_quintic(max(lo, cushion * hi), hi)
        p_lo = a * lo + b * lo**3 + c * lo**5
        p_hi = a * hi + b * hi**3 + c * hi**5
        rescale = 2.0 / (p_lo + p_hi)
        a, b, c = a * rescale, b * rescale, c * rescale
        table.append((a, b, c))
        lo = a * lo + b * lo**3 + c * lo**5
        hi = 2.0 - lo
    s = float(safety)
    table = [(a / s, b / s**3, c / s**5) for a, b, c in table[:-1]] + [table[-1]]
    return tuple(table)


def auto_coefficients(compute_dtype: Any = None, shape: tuple[int, int] | None = None) -> str:
    """What ``coefficients='auto'`` means for a compute dtype (and matrix shape).

    ``'quintic'`` (5 steps from the Frobenius-normalized start) for >= 32-bit
    compute (the CPU default); ``'power4'`` (4 steps from the ``'power'``
    start) for bfloat16 compute (the GPU/TPU default);
    ``'polar_express_schatten'`` (4 steps from the Schatten-4 start) for
    float16; see :func:`auto_schedule`.

    Args:
      compute_dtype: the iteration's dtype (``None``: the backend's default).
      shape: the matrix shape ``(m, n)``.
    """
    return auto_schedule(*(shape or (1, 1)), compute_dtype=compute_dtype)[0]


def auto_schedule(m: int, n: int, compute_dtype: Any = None) -> tuple[str, str, tuple[int, ...] | None]:
    """``(coefficients, method, restarts)`` that ``coefficients='auto'`` runs for an ``m x n`` matrix.

    The one place where the default iteration is chosen (from the compute
    dtype and the matrix's shape):

    * >= 32-bit compute: ``('quintic', 'auto', None)``: 5 quintic steps from
      the Frobenius start; ``newton_schulz_method`` and ``gram_restarts`` decide
      the rest (at ``Precision.HIGHEST``: Gram space without restarts where it
      saves >= 25% of the flops: aspect >= 2.41 at 5 steps);
    * bfloat16 (the GPU/TPU default): :func:`power4_schedule`, 4 ``'power4'``
      steps from the ``'power'`` start, standard for ``max(m, n) <
      AUTO_GRAM_ASPECT * min(m, n)`` and otherwise ``('power4', 'gram', (1,))``:
      the first step in ``X`` space, the other three in Gram space (a tall
      matrix on its transpose); 0.600x the flops of 5 quintic steps on the
      GPT-2-small tree with its head (docs/math.md, "Orthogonalization at
      fewer flops");
    * float16: ``('polar_express_schatten', 'auto', None)``: 4 steps from the
      Schatten-4 start; ``newton_schulz_method`` runs Gram space with a restart
      every 2 steps where that saves >= 25% (aspect >= 3.5 at 4 steps).

    docs/guide.md ("Coefficients") renders this function's choices per dtype
    and shape (``tools/render_defaults.py``; a test compares them).

    Args:
      m: rows.
      n: columns.
      compute_dtype: the iteration's dtype (``None``: the backend's default).
    """
    cdtype = jnp.dtype(compute_dtype if compute_dtype is not None else default_compute_dtype())
    if cdtype.itemsize >= 4:
        return "quintic", "auto", None
    if cdtype == jnp.bfloat16:
        return power4_schedule(m, n)
    return "polar_express_schatten", "auto", None


def power4_schedule(m: int, n: int) -> tuple[str, str, tuple[int, ...]]:
    """``(coefficients, method, restarts)`` of the bfloat16 default for an ``m x n`` matrix:
    ``'power4'`` standard on ``max(m, n) < AUTO_GRAM_ASPECT * min(m, n)``, else in Gram space with
    one restart at step 1 (``8 s^2 l + 20 s^3`` flops, ``s`` the short side, ``l`` the long one).

    Args:
      m: rows.
      n: columns.
    """
    if max(m, n) >= AUTO_GRAM_ASPECT * min(m, n):
        return "power4", "gram", (1,)
    return "power4", "standard", ()


def default_preconditioning(coefficients: Coefficients) -> str:
    """The preconditioning a coefficient spec is designed for: ``'schatten'``
    for ``'polar_express_schatten'``, ``'power'`` for ``'power3'`` and
    ``'power4'``, ``'frobenius'`` for every other.

    Args:
      coefficients: a coefficient spec (see :func:`resolve_coefficients`).
    """
    if isinstance(coefficients, str):
        name = coefficients.lower().replace("-", "_")
        if name in ("polar_express_schatten", "pe_schatten"):
            return "schatten"
        if name in ("power3", "power4"):
            return "power"
    return "frobenius"


def resolve_coefficients(coefficients: Coefficients = "quintic", steps: int | None = None, compute_dtype: Any = None):
    """Turn a coefficient spec into ``(table, norm_safety)`` or a callable.

    Args:
      coefficients: ``'auto'`` (``auto_coefficients`` of
        ``compute_dtype``), ``'quintic'`` (:data:`MUON_QUINTIC`, default 5 steps),
        ``'polar_express'`` (:func:`polar_express_coefficients` with ``steps``
        polynomials, default 8), ``'polar_express_schatten'`` (the same
        construction on ``[SCHATTEN_POLAR_EXPRESS_L, 1]``, default 4 steps,
        for the Schatten-4-normalized start), ``'power3'``
        (:data:`POWER3_COEFFICIENTS`, default 3 steps, for the ``'power'``
        start), ``'power4'`` (:data:`POWER4_COEFFICIENTS`, 4 steps, the same
        start), ``'you'`` (alias ``'dion'``:
        :data:`YOU_COEFFICIENTS`, default 5 steps), one ``(a, b, c)`` triple
        (repeated ``steps`` times, default 5), a table ``[(a, b, c), ...]``
        (``steps`` defaults to its length; more steps repeat the last row), or
        a callable, returned unchanged. A named table with ``steps`` below its
        length uses its first ``steps`` rows, the convention of the published
        Polar Express code (``coeffs_list[:steps]``; Amsel et al. 2025): the
        ``N``-step Polar Express table is the first ``N`` rows of the 8-step
        one, except that the safety factor is not applied to its last row.
      steps: number of iterations.
      compute_dtype: the iteration's dtype, for ``'auto'`` (``None``: the
        backend's default, :func:`default_compute_dtype`).

    Returns:
      ``(tuple of (a, b, c), normalization safety factor)``, or the callable.
    """
    if callable(coefficients):
        return coefficients
    if steps is not None and int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if isinstance(coefficients, str):
        name = coefficients.lower().replace("-", "_").replace(" ", "_")
        if name == "auto":  # without a shape: the schedule of square matrices
            return resolve_coefficients(auto_coefficients(compute_dtype), steps)
        if name in ("quintic", "muon", "standard"):
            return (MUON_QUINTIC,) * int(steps or 5), 1.0
        if name in ("polar_express", "polarexpress", "pe"):
            return polar_express_coefficients(int(steps or 8)), POLAR_EXPRESS_SAFETY
        if name in ("polar_express_schatten", "pe_schatten"):
            return polar_express_coefficients(int(steps or 4), l=SCHATTEN_POLAR_EXPRESS_L), POLAR_EXPRESS_SAFETY
        if name in ("power3", "power4"):
            named = POWER3_COEFFICIENTS if name == "power3" else POWER4_COEFFICIENTS
            first = list(named[: int(steps or len(named))])
            return tuple(first + [first[-1]] * (int(steps or len(named)) - len(first))), 1.0
        if name in ("you", "dion"):
            first = list(YOU_COEFFICIENTS[: int(steps or 5)])
            return tuple(first + [first[-1]] * (int(steps or 5) - len(first))), 1.0
        raise ValueError(
            f"unknown coefficients {coefficients!r}; use 'auto', 'quintic', 'polar_express', "
            "'polar_express_schatten', 'power3', 'power4', 'you', a table "
            "[(a, b, c), ...] or a function"
        )
    try:
        table = np.asarray(coefficients, dtype=np.float64)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:  # traced values
        raise ValueError(
            "Newton-Schulz coefficients must be concrete numbers (they are unrolled into the "
            f"computation), got {type(coefficients).__name__}"
        ) from e
    if table.ndim == 1:
        table = table[None]
        if steps is None:
            steps = 5
    if table.ndim != 2 or table.shape[1] != 3 or table.shape[0] == 0:
        raise ValueError(
            f"Newton-Schulz coefficients must be (a, b, c) or a table of shape (steps, 3), got shape {table.shape}"
        )
    if not np.all(np.isfinite(table)):
        raise ValueError("Newton-Schulz coefficients must be finite")
    rows = [tuple(float(v) for v in row) for row in table]
    if steps is not None:
        if steps < len(rows) and table.shape[0] > 1:
            raise ValueError(
                f"steps={steps} is fewer than the {len(rows)} rows of the coefficient table; "
                "pass the first rows explicitly or a shorter table"
            )
        rows = rows + [rows[-1]] * (int(steps) - len(rows))
    return tuple(rows), 1.0


# --------------------------------------------------------------------------
# The iteration.
# --------------------------------------------------------------------------
def _dot(x, y, contract_x, contract_y, precision):
    """Batched matmul over the leading axis with chosen contraction axes."""
    return jax.lax.dot_general(
        x,
        y,
        (((contract_x,), (contract_y,)), ((0,), (0,))),
        precision=precision,
        preferred_element_type=x.dtype,
    )


def _form_gram(x, wide: bool, precision, psum):
    """``A = X X^T`` (wide: rows side) or ``X^T X`` (tall: columns side), ``psum``-ed."""
    return psum(_dot(x, x, 2, 2, precision) if wide else _dot(x, x, 1, 1, precision))


def _pack_symmetric(a):
    """The upper triangle (diagonal included) of each symmetric ``s x s`` matrix of ``a``
    (``(B, s, s)``) as one ``(B, s (s + 1) / 2)`` buffer, by slices and masks only (no gather).

    With ``h = floor(s / 2)`` and the blocks ``A_11`` (``h x h``), ``A_12`` (``h x (s - h)``),
    ``A_22``: ``A_12`` whole, and ``triu(A_11)`` and ``tril(A_22)`` sharing one
    ``(h + 1) x (s - h)`` rectangle (one on each side of its diagonal, shifted by one row for
    even ``s``, by one column for odd ``s``): ``h (s - h) + (h + 1)(s - h) = s (s + 1) / 2``."""
    s = a.shape[-1]
    lo, hi = s // 2, s - s // 2  # h = lo: A_11 is lo x lo, A_22 is hi x hi (hi = lo or lo + 1)
    a11, a12, a22 = a[:, :lo, :lo], a[:, :lo, lo:], a[:, lo:, lo:]
    upper = jnp.triu(a11)
    lower = jnp.tril(a22)
    if lo == hi:  # even: triu(A_11) in rows 0..lo-1, tril(A_22) in rows 1..lo
        rect = jnp.pad(upper, ((0, 0), (0, 1), (0, 0))) + jnp.pad(lower, ((0, 0), (1, 0), (0, 0)))
    else:  # odd: tril(A_22) fills the rectangle's lower triangle, triu(A_11) right of it
        rect = lower + jnp.pad(upper, ((0, 0), (0, 1), (1, 0)))
    return jnp.concatenate([a12.reshape(a.shape[0], -1), rect.reshape(a.shape[0], -1)], axis=1)


def _unpack_symmetric(buf, s: int):
    """The symmetric ``(B, s, s)`` matrices whose upper triangles :func:`_pack_symmetric` packed."""
    lo, hi = s // 2, s - s // 2
    b = buf.shape[0]
    a12 = buf[:, : lo * hi].reshape(b, lo, hi)
    rect = buf[:, lo * hi :].reshape(b, lo + 1, hi)
    if lo == hi:
        upper, lower = jnp.triu(rect[:, :lo]), jnp.tril(rect[:, 1:])
    else:
        upper, lower = jnp.triu(rect[:, :lo, 1:]), jnp.tril(rect)
    t = lambda m: jnp.swapaxes(m, 1, 2)
    a11 = upper + t(jnp.triu(upper, 1))
    a22 = lower + t(jnp.tril(lower, -1))
    return jnp.concatenate([jnp.concatenate([a11, a12], axis=2), jnp.concatenate([t(a12), a22], axis=2)], axis=1)


def psum_symmetric(a, axis_name):
    """``psum`` of a batch ``(B, s, s)`` of symmetric matrices (Gram matrices) over
    ``axis_name``, sending the upper triangles only: ``s (s + 1) / 2`` instead of ``s^2``
    elements per matrix, about half the bytes. The result is the upper triangle of the
    sum, mirrored (exactly symmetric).

    Args:
      a: ``(B, s, s)`` symmetric matrices, this device's terms of the sum (only their upper
        triangles are read).
      axis_name: the mapped axis (or axes) to sum over, as for ``jax.lax.psum``; inside
        ``shard_map`` or ``pmap``.

    Returns:
      The ``(B, s, s)`` sum over ``axis_name``, the same on every device of the axis.
    """
    s = a.shape[-1]
    return _unpack_symmetric(jax.lax.psum(_pack_symmetric(a), axis_name), s)


def _apply(q, x, wide: bool, precision):
    """``Q X`` (wide) or ``X Q`` (tall): a polynomial in the Gram matrix applied to ``X``."""
    return _dot(q, x, 2, 1, precision) if wide else _dot(x, q, 2, 1, precision)


def _power_estimate(sq, iterations: int, starts: int = POWER_STARTS):
    """Rayleigh-quotient lower estimate of ``lambda_max`` of each symmetric PSD ``sq`` (float32).

    ``iterations`` power steps ``v <- sq v / ||sq v||`` from ``starts`` fixed
    pseudo-random starts side by side (the same for every call, so the result
    is deterministic); each gives ``v^T sq v <= lambda_max`` and the largest
    over starts and steps is returned. Matrix-vector products only: ``2 k^2``
    flops each, ``iterations * starts`` of them.
    """
    k = sq.shape[-1]
    v = jax.random.normal(jax.random.key(0), (k, starts), sq.dtype)
    v = jnp.broadcast_to(v / jnp.linalg.norm(v, axis=0), sq.shape[:-1] + (starts,))
    best = jnp.zeros(sq.shape[:-2], sq.dtype)
    hp = jax.lax.Precision.HIGHEST
    for _ in range(iterations):
        w = jnp.einsum("bij,bjs->bis", sq, v, precision=hp)
        best = jnp.maximum(best, jnp.max(jnp.sum(v * w, axis=-2), axis=-1))
        norm = jnp.linalg.norm(w, axis=-2, keepdims=True)
        v = jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1), v)
    return best


def _guard(y, start, rank: int, psum):
    """``y`` where ``||y||_F^2 <= POWER_GUARD^2 rank`` (and finite), else ``start``, per matrix
    (the Frobenius norm ``psum``-ed over a split)."""
    sumsq = psum(jnp.sum(jnp.square(y.astype(jnp.promote_types(y.dtype, jnp.float32))), axis=(1, 2)))
    ok = sumsq <= POWER_GUARD**2 * rank  # False for NaN
    return jnp.where(ok[:, None, None], y, start.astype(y.dtype))


def _precondition(x, preconditioning: str, safety: float, wide: bool, precision, psum):
    """The iteration's start ``X_0`` and what was formed on the way: ``(X_0, A_0, A_0^2)``.

    ``x`` is Frobenius-normalized (``||x||_F = 1``) in the compute dtype. With
    ``A = x x^T`` on the Gram side (docs/math.md, "Orthogonalization at fewer flops"):

    * ``'frobenius'``: ``X_0 = x / s`` (``A_0`` not formed here);
    * ``'schatten'``: ``X_0 = x / (s ||A||_F^(1/2))``, ``A_0 = A / (s^2 ||A||_F)``
      (``||A||_F^(1/2)`` is the Schatten-4 norm of ``x``, between its largest
      singular value and its Frobenius norm);
    * ``'aol'``: ``X_0 = D x / s``, ``A_0 = D A D / s^2`` with
      ``D = diag(sum_j |A_ij|)^(-1/2)``, which gives ``||X_0||_2 <= 1 / s``;
    * ``'power'``: with ``B = A / ||A||_F`` and its square ``B^2`` (the first
      step's), ``mu = min(||B^2||_F^(1/2), POWER_SAFETY^2 rho^(1/2))``, ``rho``
      the power-iteration estimate of ``lambda_max(B^2)``
      (:func:`_power_estimate`, :data:`POWER_ITERATIONS` matrix-vector
      products); ``X_0 = x / (s (||A||_F mu)^(1/2))``, ``A_0 = B / (s^2 mu)``,
      ``A_0^2 = B^2 / (s^4 mu^2)``. ``mu^(1/2) ||A||_F^(1/2)`` is then at
      most the Schatten-8 norm of ``x`` (an upper bound of sigma_max) and at
      most ``POWER_SAFETY`` times sigma_max when the estimate is within that
      factor.

    The scale factors are computed in float32 from the compute-dtype ``A``
    (and ``B^2``); ``A_0`` (and ``A_0^2``) serve the first step, so none adds a
    matmul.
    """
    if preconditioning == "frobenius":
        return ((x / safety).astype(x.dtype) if safety != 1 else x), None, None
    gram = _form_gram(x, wide, precision, psum)
    g32 = gram.astype(jnp.promote_types(gram.dtype, jnp.float32))
    if preconditioning in ("schatten", "power"):
        t = jnp.sqrt(jnp.sum(jnp.square(g32), axis=(1, 2), keepdims=True))
        inv = jnp.where(t > 0, 1 / jnp.where(t > 0, t, 1), 0)
        if preconditioning == "schatten":
            inv = inv / safety**2
            x0 = x.astype(g32.dtype) * jnp.sqrt(inv)
            return x0.astype(x.dtype), (g32 * inv).astype(gram.dtype), None
        b = (g32 * inv).astype(gram.dtype)
        sq = _dot(b, b, 2, 1, precision)
        sq32 = sq.astype(g32.dtype)
        s8 = jnp.sqrt(jnp.sqrt(jnp.sum(jnp.square(sq32), axis=(1, 2))))
        mu = jnp.minimum(s8, POWER_SAFETY**2 * jnp.sqrt(_power_estimate(sq32, POWER_ITERATIONS)))
        mu = (mu * safety**2)[:, None, None]
        rmu = jnp.where(mu > 0, 1 / jnp.where(mu > 0, mu, 1), 0)
        x0 = x.astype(g32.dtype) * jnp.sqrt(inv * rmu)
        gram0 = (b.astype(g32.dtype) * rmu).astype(gram.dtype)
        return x0.astype(x.dtype), gram0, (sq32 * jnp.square(rmu)).astype(gram.dtype)
    rows = jnp.sum(jnp.abs(g32), axis=2)  # (B, k): row sums of |A|
    d = jnp.where(rows > 0, jax.lax.rsqrt(jnp.where(rows > 0, rows, 1)), 0) / safety
    x0 = x.astype(g32.dtype) * (d[:, :, None] if wide else d[:, None, :])
    return x0.astype(x.dtype), (g32 * d[:, :, None] * d[:, None, :]).astype(gram.dtype), None


def _first_step(x, table, wide: bool, precision, gram0, sq0):
    """The first step from a start whose ``A_0`` and ``A_0^2`` were formed by the
    preconditioning, ``X_1 = a X_0 + (b A_0 + c A_0^2) X_0``, rounded to the
    compute dtype once: the polynomial is summed and ``a X_0`` added in float32
    (in bfloat16 the separately rounded terms, ``a ~ 8`` against a sum ``~ 1``,
    put the largest singular values 0.6% high after this step and 0.6 high
    after three; docs/benchmarks.md). Returns ``X_1`` and the remaining rows."""
    a, b, c = table[0]
    f32 = jnp.promote_types(x.dtype, jnp.float32)
    poly = (b * gram0.astype(f32) + c * sq0.astype(f32)).astype(x.dtype)
    lhs, rhs = (poly, x) if wide else (x, poly)  # P X (wide) or X P (tall), as ``_apply``
    px = jax.lax.dot_general(lhs, rhs, (((2,), (1,)), ((0,), (0,))), precision=precision, preferred_element_type=f32)
    return (a * x.astype(f32) + px).astype(x.dtype), table[1:]


def _standard(x, table, wide: bool, precision, axis_name=None, gram0=None):
    """``X <- a X + (b A + c A^2) X`` with ``A`` on the short side (with
    ``axis_name``: on the side that contracts the split axis, summed over it by
    :func:`psum_symmetric`);
    ``gram0``: the first step's ``A`` when the preconditioning formed it.

    A split block narrower than ``A`` (``w`` local columns, ``s x s`` Gram, ``w < s``) is updated
    as ``a X + b (A X) + c A (A X)``: ``4 s^2 w`` flops instead of ``2 s^3 + 2 s^2 w``, the
    ``s^3`` product ``A^2`` being the same on every device of the split."""
    psum = (lambda a: a) if axis_name is None else (lambda a: psum_symmetric(a, axis_name))
    s, w = (x.shape[-2], x.shape[-1]) if wide else (x.shape[-1], x.shape[-2])
    for i, (a, b, c) in enumerate(table):
        gram = gram0 if i == 0 and gram0 is not None else _form_gram(x, wide, precision, psum)
        if axis_name is not None and w < s:
            ax = _apply(gram, x, wide, precision)
            x = a * x + b * ax + c * _apply(gram, ax, wide, precision)
            continue
        poly = b * gram + c * _dot(gram, gram, 2, 1, precision)
        x = a * x + _apply(poly, x, wide, precision)
    return x


def _gram(x, table, wide: bool, precision, restarts: Sequence[int] = (), gram0=None, sq0=None):
    """Gram-space iteration: iterate on the small Gram matrix, apply to X at the end of each segment.

    With ``R_0 = X X^T`` (short side) every ``R_k`` and every step polynomial
    ``P_k = a I + b R_k + c R_k^2`` are polynomials in ``R_0``, so they commute::

        X_K = Q X_0,   Q = P_{K-1} ... P_0,   R_{k+1} = P_k R_k P_k.

    ``restarts``: step indices ``i`` at which the segment ends: ``X_i = Q X``
    is formed and ``R_i = X_i X_i^T`` recomputed from it, which discards the
    round-off (lost symmetry, spurious eigenvalues) accumulated in ``R`` and
    ``Q``. Flops for an ``m x n`` matrix (``m <= n``), ``K`` steps in ``j``
    segments: ``j 4 m^2 n + 2 m^3 (4 K - 3 j)`` (:func:`newton_schulz_flops`).
    ``gram0``: ``R_0`` when the preconditioning formed it (``sq0``: ``R_0^2``, too).
    """
    ident = lambda a: a
    gram = gram0 if gram0 is not None else _form_gram(x, wide, precision, ident)
    eye = jnp.eye(gram.shape[-1], dtype=gram.dtype)
    q = None
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts and q is not None:
            x = _apply(q, x, wide, precision)
            gram, q = _form_gram(x, wide, precision, ident), None
        square = sq0 if i == 0 and sq0 is not None else _dot(gram, gram, 2, 1, precision)
        poly = a * eye + b * gram + c * square
        q = poly if q is None else _dot(poly, q, 2, 1, precision)
        if i < last and i + 1 not in restarts:
            gram = _dot(_dot(gram, poly, 2, 1, precision), poly, 2, 1, precision)
            # Restore exact symmetry lost to round-off (cheap, elementwise).
            gram = 0.5 * (gram + jnp.swapaxes(gram, 1, 2))
    return _apply(q, x, wide, precision)


def _platform() -> str:
    """The default backend's platform (a seam: tests simulate a GPU by patching it)."""
    return jax.default_backend()


def resolve_precision(precision: Any = None, dtype: Any = jnp.float32):
    """The ``jax.lax.Precision`` the iteration's matmuls run at.

    ``None`` means "the compute dtype's own accuracy": ``Precision.HIGHEST``
    for >= 32-bit compute (true float32 products on every backend: no
    TensorFloat-32 on NVIDIA GPUs, no single bfloat16 pass on TPUs), the
    backend default for bfloat16/float16 compute (native low-precision
    products with float32 accumulation). Anything else (a ``Precision``, a
    string such as ``'tensorfloat32'`` or ``'highest'``, or a pair) is passed
    to ``jax.lax.dot_general`` unchanged.
    """
    if precision is not None:
        return precision
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype).itemsize >= 4 else None


def _is_full_precision(precision) -> bool:
    """Whether ``precision`` guarantees float32-accurate products on every backend."""
    if precision is None:
        return False
    if isinstance(precision, (tuple, list)):
        return len(precision) > 0 and all(_is_full_precision(p) for p in precision)
    try:
        return jax.lax.Precision(precision) == jax.lax.Precision.HIGHEST
    except (ValueError, TypeError, KeyError):  # e.g. a DotAlgorithmPreset
        return False


def _mantissa_bits(dtype, precision: Any = None) -> int:
    """Mantissa bits of the iteration's products: 23 for float32 at ``HIGHEST``,
    10 for float16 and for float32 at any lower precision (TensorFloat-32 on a
    GPU; a TPU's single bfloat16 pass has 7, so this is optimistic there), 7
    for bfloat16."""
    dtype = jnp.dtype(dtype)
    if dtype.itemsize >= 4:
        return 52 if dtype.itemsize >= 8 else (23 if _is_full_precision(resolve_precision(precision, dtype)) else 10)
    return int(jnp.finfo(dtype).nmant)


def gram_restarts(steps: int, dtype=jnp.float32, precision: Any = None, restarts: Any = None) -> tuple[int, ...]:
    """The restart schedule of the Gram-space iteration (step indices where ``X`` is re-formed).

    ``restarts`` given (a sequence of step indices in ``1 .. steps - 1``):
    returned sorted. ``None``: the default for the mantissa bits of the
    products (the bands these hold: docs/benchmarks.md, "Orthogonalization
    methods"):

    * float32 at ``Precision.HIGHEST`` (23 mantissa bits): no restart;
    * float16 and float32 at a lower precision (10 bits): every
      :data:`HALF_PRECISION_RESTART_EVERY` = 2 steps (as in Dao-AILab's
      gram-newton-schulz, which runs in float16);
    * bfloat16 (7 bits): every step but the last two (``1 .. steps - 2``):
      a bfloat16 Gram matrix cannot resolve the small eigenvalues ``sigma^2``
      of the first steps (docs/math.md, "Orthogonalization at fewer flops").

    The bfloat16 default of ``coefficients='auto'`` does not use this schedule:
    :func:`power4_schedule` passes its own, ``(1,)``, to :func:`newton_schulz`.

    Args:
      steps: iterations.
      dtype: the compute dtype.
      precision: the matmuls' precision (``resolve_precision``).
      restarts: an explicit schedule, or ``None``.
    """
    if restarts is not None:
        out = tuple(sorted({int(i) for i in restarts}))
        if any(not 0 < i < steps for i in out):
            raise ValueError(f"restarts must be step indices in 1 .. {steps - 1} (steps={steps}), got {restarts}")
        return out
    bits = _mantissa_bits(dtype, precision)
    if bits >= 23:
        return ()
    if bits >= 10:
        return tuple(range(HALF_PRECISION_RESTART_EVERY, steps, HALF_PRECISION_RESTART_EVERY))
    return tuple(range(1, steps - 1))


def newton_schulz_method(
    m: int, n: int, steps: int, dtype=jnp.float32, method: str = "auto", precision: Any = None
) -> str:
    """The variant :func:`newton_schulz` runs for an ``m x n`` matrix: ``'standard'`` or ``'gram'``.

    The Gram-space variant has no self-correction through ``X`` within a
    segment: the round-off of every Gram-space product accumulates in ``Q``,
    and with fewer than 23 mantissa bits that leaves the band around 1 or
    overflows (docs/math.md, "Orthogonalization at fewer flops"; the figures
    are in docs/lab_log.md). Restarts (``gram_restarts``) re-form ``X`` and
    bound the accumulation. ``'auto'`` picks it when it saves at least 25% of the flops
    (:func:`newton_schulz_flops`, with those restarts) and

    * the compute ``dtype`` has >= 32 bits **and** the matmuls run at
      ``Precision.HIGHEST`` (``resolve_precision``: the default for
      float32 compute; an explicit lower ``precision`` such as
      ``'tensorfloat32'`` or ``Precision.DEFAULT`` disables it on every
      backend, even on a CPU where it would be exact, so that the choice,
      and the result, do not depend on the backend): no restarts; or
    * the compute ``dtype`` is float16 and ``steps <= 5``: a restart every
      2 steps (longer schedules run the standard iteration: Polar Express 8
      steps left its band in Gram space there; docs/lab_log.md).

    In bfloat16 the restarts ``gram_restarts`` gives (all but the last two
    steps) leave less than 25% to save, so ``'auto'`` returns ``'standard'``
    there; with ``coefficients='auto'``, :func:`newton_schulz` passes
    :func:`power4_schedule`'s method instead (``'gram'`` on aspect >=
    ``AUTO_GRAM_ASPECT``, with its one restart), returned unchanged. The
    choice depends on the dtype and precision only, never on the backend.

    Args:
      m: rows.
      n: columns.
      steps: iterations.
      dtype: the compute dtype.
      method: ``'auto'``, ``'standard'`` or ``'gram'`` (the last two returned
        unchanged).
      precision: the matmuls' precision (``resolve_precision``).
    """
    if method in ("standard", "gram"):
        return method
    if jnp.dtype(dtype).itemsize >= 4 and not _is_full_precision(resolve_precision(precision, dtype)):
        return "standard"
    if _mantissa_bits(dtype, precision) < 23 and steps > 5:
        return "standard"
    restarts = gram_restarts(steps, dtype, precision)
    gram = newton_schulz_flops(m, n, steps, "gram", restarts=restarts)
    return "gram" if gram <= 0.75 * newton_schulz_flops(m, n, steps, "standard") else "standard"


def _use_gram(method: str, m: int, n: int, steps: int, dtype, precision: Any = None) -> bool:
    return newton_schulz_method(m, n, steps, dtype, method, precision) == "gram"


def newton_schulz_flops(
    m: int, n: int, steps: int, method: str = "standard", *, restarts: Sequence[int] = (), preconditioning: str = ""
) -> int:
    """Matmul flops of one ``m x n`` orthogonalization (2 flops per multiply-add).

    Standard: ``steps * (4 s^2 l + 2 s^3)``; Gram-space in ``j = 1 +
    len(restarts)`` segments: ``j 4 s^2 l + 2 s^3 (4 steps - 3 j)``, with ``s
    = min(m, n)``, ``l = max(m, n)``. The preconditionings add no matmul (the
    Gram matrix they form is the first step's, and ``'power'``'s square too);
    ``preconditioning='power'`` adds its ``POWER_ITERATIONS * POWER_STARTS``
    (8 x 4) matrix-vector products, ``2 s^2`` flops each.

    Args:
      m: rows.
      n: columns.
      steps: iterations.
      method: ``'standard'`` or ``'gram'``.
      restarts: the Gram-space restart steps (``gram_restarts``).
      preconditioning: the start's preconditioning (only ``'power'`` adds flops).
    """
    s, l = min(m, n), max(m, n)
    extra = POWER_ITERATIONS * POWER_STARTS * 2 * s * s if preconditioning == "power" else 0
    if method == "gram":
        j = 1 + len([i for i in restarts if 0 < i < steps])
        return j * 4 * s * s * l + 2 * s**3 * max(4 * steps - 3 * j, 1) + extra
    return steps * (4 * s * s * l + 2 * s**3) + extra


def default_compute_dtype():
    """bfloat16 on GPU/TPU (as Muon is run there), float32 elsewhere."""
    return jnp.bfloat16 if _platform() in ("gpu", "cuda", "rocm", "tpu") else jnp.float32


def user_function_dtype(compute_dtype: Any = None):
    """The dtype a user orthogonalization function receives: ``compute_dtype``
    promoted to at least float32 (float32 for the bfloat16 default of GPUs
    and TPUs, which ``jnp.linalg`` rejects; float64 if asked for)."""
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else default_compute_dtype()
    return jnp.promote_types(cdtype, jnp.float32)


def newton_schulz(
    x: jax.Array,
    coefficients: Coefficients = "auto",
    *,
    steps: int | None = None,
    compute_dtype: Any = None,
    method: str = "auto",
    norm_safety: float | None = None,
    precision: Any = None,
    axis_name: Any = None,
    sharded_axis: int = -1,
    preconditioning: str | None = None,
    restarts: Sequence[int] | None = None,
) -> jax.Array:
    """Approximate orthogonal polar factor ``U V^T`` of every matrix in ``x``.

    ``x`` of shape ``(..., m, n)`` is a batch of matrices ``G = U S V^T``; each
    is normalized, ``X_0 = G / (||G||_F * norm_safety)`` (computed in float32
    after dividing by ``max |G|``, so huge or tiny entries neither overflow
    nor vanish and a zero matrix stays exactly zero), then iterated with the
    odd quintics of ``coefficients``::

        X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k,   A_k = X_k X_k^T.

    The result is ``U p(S) V^T`` with ``p`` the composed polynomial.

    Args:
      x: array of shape ``(..., m, n)``; leading axes are independent matrices.
      coefficients: ``'auto'`` (default, :func:`auto_schedule`:
        ``'quintic'`` for >= 32-bit compute, ``'power4'`` by shape for
        bfloat16, ``'polar_express_schatten'`` for float16; with ``axis_name`` the whole matrix's shape
        is the one passed to it), ``'quintic'`` (:data:`MUON_QUINTIC`, 5 steps),
        ``'polar_express'`` (:func:`polar_express_coefficients`, 8 steps by
        default), ``'polar_express_schatten'`` (4 steps, for the
        Schatten-4-normalized start), ``'power3'`` (3 steps, for the
        ``'power'`` start), ``'power4'`` (4 steps, the same start), ``'you'`` (alias ``'dion'``,
        :data:`YOU_COEFFICIENTS`, 5 steps), an ``(a, b, c)`` triple, a table
        of triples (see ``resolve_coefficients``), or a function
        ``f(x) -> x`` replacing the normalization and iteration altogether,
        e.g. an exact SVD-based polar factor. It is called on the
        ``(batch, m, n)`` array in ``user_function_dtype`` (``compute_dtype``
        promoted to at least float32, so float32 under the bfloat16 default of
        GPUs/TPUs: ``jnp.linalg.svd`` rejects bfloat16) and, unless
        ``precision`` is given, traced under
        ``jax.default_matmul_precision('highest')``.
      steps: number of iterations (see ``resolve_coefficients``).
      compute_dtype: dtype of the iteration. ``None``: float32 on CPU,
        bfloat16 on GPU/TPU. The result is cast back to ``x.dtype``.
        ``float32`` means float32 arithmetic on every backend: unless
        ``precision`` says otherwise its matmuls run at ``Precision.HIGHEST``
        (a GPU's default for float32 is TensorFloat-32, 10 mantissa bits, and
        a TPU's a single bfloat16 pass). That is several times slower on
        tensor cores than bfloat16; for speed use the bfloat16 default, or
        ``precision='tensorfloat32'`` (then ``'auto'`` never picks ``'gram'``).
      method: ``'standard'``, ``'gram'`` (Gram-space variant, cheaper for
        rectangular matrices) or ``'auto'`` (``newton_schulz_method``:
        Gram-space when it saves >= 25% of the flops and either
        ``compute_dtype`` has >= 32 bits with the matmuls at
        ``Precision.HIGHEST`` (e.g. aspect ratio ``max(m, n) / min(m, n) >=
        2.5`` for 5 steps), or it is float16 with at most 5 steps, with
        restarts; not in bfloat16, where the default schedule of
        ``coefficients='auto'``, :func:`power4_schedule`, asks for it by shape).
      norm_safety: factor ``>= 1`` on the Frobenius norm; ``None``: 1.01 for
        ``'polar_express'`` (as published), 1 otherwise.
      precision: ``jax.lax.Precision`` (or string, or pair) of the matmuls;
        ``None``: ``resolve_precision`` (``HIGHEST`` for >= 32-bit
        compute, the backend default for bfloat16).
      axis_name: inside ``shard_map``: the mesh axes (a name or a tuple)
        over which axis ``sharded_axis`` of every matrix is split. The
        normalization uses ``pmax`` / ``psum`` over them, and every step
        forms the Gram matrix by contracting the split axis and ``psum``-s
        it (``X X^T`` for split columns, ``X^T X`` for split rows), so each
        device updates its own block and the result equals the unsharded
        iteration (standard method). ``None``: ``x`` holds whole matrices.
      sharded_axis: ``-1`` (columns, e.g. a Flax kernel sharded on its
        fan-out axis) or ``-2`` (rows); used with ``axis_name`` only.
      preconditioning: how the start ``X_0`` is scaled so that every singular
        value is <= 1 (docs/math.md, "Orthogonalization at fewer flops"): ``None`` (default: the one
        the coefficients are designed for, ``default_preconditioning``),
        ``'frobenius'`` (``G / ||G||_F``), ``'schatten'`` (``G / ||G||_{S_4}``, ``||G||_{S_4} =
        ||G G^T||_F^(1/2)``, a tighter bound on the largest singular value)
        or ``'aol'`` (``D G / ||G||_F`` with ``D`` the inverse square roots
        of the row sums of ``|A|``, ``A`` the normalized Gram matrix;
        Turbo-Muon), the last two reusing their Gram matrix as the first
        step's, or ``'power'`` (``G / min(||G||_{S_8}, POWER_SAFETY *
        estimate)``, the estimate of the largest singular value from
        ``POWER_ITERATIONS`` (8) power steps of ``POWER_STARTS`` (4) start
        vectors on the first step's ``A^2``: matrix-vector products only; made
        for ``'power3'`` and ``'power4'``, whose first step it also rounds once;
        a result outside the band is replaced by the start, ``POWER_GUARD``).
        ``'aol'`` rescales rows, so its result approximates the polar factor
        of ``D G``, not of ``G``: close to orthogonal, on slightly different
        singular vectors.
      restarts: Gram-space method only: step indices at which ``X`` is
        re-formed and its Gram matrix recomputed (``None``: with
        ``coefficients='auto'`` the schedule's own, :func:`auto_schedule`,
        i.e. ``(1,)`` for bfloat16 on aspect >= ``AUTO_GRAM_ASPECT``;
        otherwise ``gram_restarts``: none at float32 / ``HIGHEST``, every 2
        steps in float16, all but the last two steps in bfloat16).

    Returns:
      Array of ``x``'s shape and dtype.

    References:
      Jordan et al. (2024), Muon; Amsel et al. (2025), The Polar Express.
      docs/math.md section 4.
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"newton_schulz needs an array of shape (..., m, n), got shape {x.shape}")
    if method not in ("auto", "standard", "gram"):
        raise ValueError(f"method must be 'auto', 'standard' or 'gram', got {method!r}")
    out_dtype = x.dtype
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else default_compute_dtype()
    *_lead, m, n = x.shape
    auto_restarts: tuple[int, ...] | None = None
    gm_, gn_ = m, n  # the whole matrix's shape, also for a block of a split one
    if axis_name is not None:
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        k = math.prod(jax.lax.axis_size(a) for a in names)
        gm_, gn_ = (m, n * k) if sharded_axis in (-1, x.ndim - 1) else (m * k, n)
    if isinstance(coefficients, str) and coefficients.lower() == "auto":
        coefficients, auto_method, auto_restarts = auto_schedule(gm_, gn_, cdtype)
        method = auto_method if method == "auto" else method
    if preconditioning is None:
        preconditioning = default_preconditioning(coefficients)
    if preconditioning not in PRECONDITIONINGS:
        raise ValueError(f"preconditioning must be one of {PRECONDITIONINGS}, got {preconditioning!r}")
    xb = x.reshape((-1, m, n))
    if xb.shape[0] == 0 or m == 0 or n == 0:
        return jnp.zeros(x.shape, out_dtype)
    spec = resolve_coefficients(coefficients, steps)
    if axis_name is not None:
        if callable(spec):
            raise ValueError("newton_schulz: axis_name needs a coefficient table, not a user function")
        if sharded_axis not in (-1, -2, x.ndim - 1, x.ndim - 2):
            raise ValueError(f"sharded_axis must be -1 (columns) or -2 (rows), got {sharded_axis}")
        sharded_axis = -1 if sharded_axis in (-1, x.ndim - 1) else -2
    if callable(spec):
        fdtype = user_function_dtype(cdtype)
        if precision is None:  # float32 means float32 inside the user's function too
            with jax.default_matmul_precision("highest"):
                y = spec(xb.astype(fdtype))
        else:
            y = spec(xb.astype(fdtype))
        if tuple(y.shape) != tuple(xb.shape):
            raise ValueError(
                f"the user orthogonalization function returned shape {tuple(y.shape)} for input "
                f"{tuple(xb.shape)}; it must preserve the (batch, m, n) shape"
            )
        return y.astype(out_dtype).reshape(x.shape)
    table, default_safety = spec
    safety = float(default_safety if norm_safety is None else norm_safety)
    if safety < 1:
        raise ValueError(f"norm_safety must be >= 1, got {norm_safety}")

    # Normalize in float32 (float64 if given): prescale by max|x| first.
    ndtype = jnp.promote_types(xb.dtype, jnp.float32)
    xn = xb.astype(ndtype)
    amax = jnp.max(jnp.abs(xn), axis=(1, 2), keepdims=True)
    if axis_name is not None:
        amax = jax.lax.pmax(amax, axis_name)
    xn = xn / jnp.where(amax > 0, amax, 1).astype(ndtype)
    sumsq = jnp.sum(jnp.square(xn), axis=(1, 2), keepdims=True)
    if axis_name is not None:
        sumsq = jax.lax.psum(sumsq, axis_name)
    fro = jnp.sqrt(sumsq)
    frobenius = preconditioning == "frobenius"
    xn = xn / jnp.where(fro > 0, fro * (safety if frobenius else 1.0), 1).astype(ndtype)
    xc = xn.astype(cdtype)

    prec = resolve_precision(precision, cdtype)
    steps_ = len(table)
    if axis_name is not None:
        wide, flip = sharded_axis == -1, False
        psum = lambda a: jax.lax.psum(a, axis_name)
        x0, gram0, sq0 = _precondition(
            xc, preconditioning, 1.0 if frobenius else safety, wide, prec, lambda a: psum_symmetric(a, axis_name)
        )
        xc = x0
        if sq0 is not None:
            xc, table = _first_step(xc, table, wide, prec, gram0, sq0)
            gram0 = None
        y = _standard(xc, table, wide, prec, axis_name, gram0)
    else:
        psum = lambda a: a
        use_gram = _use_gram(method, m, n, steps_, cdtype, prec)
        # Gram space on a tall matrix runs on its transpose (NS(G^T) = NS(G)^T): measured in bfloat16,
        # the ``X^T X`` / ``X Q`` form left own singular values up to 2.6 where the wide one gave 1.2.
        flip = use_gram and m > n
        if flip:
            xc = jnp.swapaxes(xc, 1, 2)
        wide = m <= n or flip
        x0, gram0, sq0 = _precondition(xc, preconditioning, 1.0 if frobenius else safety, wide, prec, psum)
        xc = x0
        if restarts is None and auto_restarts is not None:
            restarts = tuple(i for i in auto_restarts if i < steps_)
        rs = gram_restarts(steps_, cdtype, prec, restarts) if use_gram else ()
        if sq0 is not None and (not use_gram or 1 in rs or steps_ == 1):
            # The first step in X-space (its products are formed already); a restart at 1 is this.
            xc, table = _first_step(xc, table, wide, prec, gram0, sq0)
            gram0 = sq0 = None
            rs = tuple(i - 1 for i in rs if i > 1)
        if not table:
            y = xc
        elif use_gram:
            y = _gram(xc, table, wide, prec, rs, gram0, sq0)
        else:
            y = _standard(xc, table, wide, prec, gram0=gram0)
    if preconditioning == "power":
        y = _guard(y, x0, min(gm_, gn_), psum)  # the whole matrix's rank, also for a block
    if flip:
        y = jnp.swapaxes(y, 1, 2)
    return y.astype(out_dtype).reshape(x.shape)
