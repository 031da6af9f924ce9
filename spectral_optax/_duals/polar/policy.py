"""Which iteration runs: compute dtype, matmul precision, schedule, Gram-space restarts, flops.

Every default of :func:`~spectral_optax.newton_schulz` is decided here, from the
compute dtype, the matmul precision and the matrix shape, never from the backend
(except ``default_compute_dtype``, the one backend-dependent choice):

* the compute dtype: bfloat16 on GPU/TPU, float32 elsewhere (:func:`default_compute_dtype`);
* the precision: float32 compute runs its matmuls at ``Precision.HIGHEST``
  unless told otherwise, so float32 results agree across backends
  (:func:`resolve_precision`);
* the schedule of ``coefficients='auto'`` (:func:`auto_schedule`, rendered into
  docs/guide.md, "Coefficients"): 5 quintic steps for >= 32-bit compute,
  :func:`power4_schedule` for bfloat16, ``'polar_express_schatten'`` for float16;
* the variant (:func:`newton_schulz_method`): the Gram-space iteration only where it
  saves >= 25% of the flops and the products have the mantissa bits for it, with the
  restarts of :func:`gram_restarts`;
* the flops model (:func:`newton_schulz_flops`), which the variant choice and the
  distributed plan (:mod:`spectral_optax._distributed.plan`) share.

The formulas are in docs/math.md, "Orthogonalization at fewer flops".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax._duals.polar.coefficients import (
    MUON_QUINTIC,
    POLAR_EXPRESS_SAFETY,
    POWER3_COEFFICIENTS,
    POWER4_COEFFICIENTS,
    SCHATTEN_POLAR_EXPRESS_L,
    YOU_COEFFICIENTS,
    Coefficients,
    polar_express_coefficients,
)

__all__ = [
    "AUTO_GRAM_ASPECT",
    "HALF_PRECISION_RESTART_EVERY",
    "POWER_ITERATIONS",
    "POWER_STARTS",
    "PRECONDITIONINGS",
    "auto_coefficients",
    "auto_schedule",
    "default_compute_dtype",
    "default_preconditioning",
    "gram_restarts",
    "newton_schulz_flops",
    "newton_schulz_method",
    "power4_schedule",
    "resolve_coefficients",
    "resolve_precision",
    "user_function_dtype",
]

#: Preconditionings of the iteration's start (see :func:`~spectral_optax.newton_schulz`).
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
#: ``'power'`` tables blow that value up within a step or two (docs/lab_log.md). With
#: ``p`` independent starts such a miss needs all ``p`` overlaps that small
#: (about ``(2e-3)^p`` per matrix); :data:`POWER_GUARD` catches the rest.
POWER_STARTS: int = 4

#: ``power4_schedule`` (the bfloat16 default): matrices with ``max(m, n) >=
#: AUTO_GRAM_ASPECT * min(m, n)`` run ``'power4'`` in Gram space with one restart.
AUTO_GRAM_ASPECT: float = 2.0

#: The Gram-space iteration with 10 mantissa bits (float16, TensorFloat-32)
#: restarts from ``X`` every this many steps (``gram_restarts``; the bands it
#: holds: docs/benchmarks.md, "Orthogonalization methods").
HALF_PRECISION_RESTART_EVERY: int = 2


def auto_coefficients(compute_dtype: Any = None, shape: tuple[int, int] | None = None) -> str:
    """What ``coefficients='auto'`` means for a compute dtype (and matrix shape).

    ``'quintic'`` (5 steps from the Frobenius-normalized start) for >= 32-bit
    compute (the CPU default); ``'power4'`` (4 steps from the ``'power'``
    start) for bfloat16 compute (the GPU/TPU default);
    ``'polar_express_schatten'`` (4 steps from the Schatten-4 start) for
    float16; see :func:`~spectral_optax.expert.auto_schedule`.

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
    * bfloat16 (the GPU/TPU default): :func:`~spectral_optax.expert.power4_schedule`, 4 ``'power4'``
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
    and shape (``tools/docs_tables.py``; tests/test_docs_defaults.py compares them).

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
        ``compute_dtype``), ``'quintic'`` (:data:`~spectral_optax.expert.MUON_QUINTIC`, default 5 steps),
        ``'polar_express'`` (:func:`~spectral_optax.expert.polar_express_coefficients` with ``steps``
        polynomials, default 8), ``'polar_express_schatten'`` (the same
        construction on ``[SCHATTEN_POLAR_EXPRESS_L, 1]``, default 4 steps,
        for the Schatten-4-normalized start), ``'power3'``
        (:data:`~spectral_optax.expert.POWER3_COEFFICIENTS`, default 3 steps, for the ``'power'``
        start), ``'power4'`` (:data:`~spectral_optax.expert.POWER4_COEFFICIENTS`, 4 steps, the same
        start), ``'you'`` (alias ``'dion'``:
        :data:`~spectral_optax.expert.YOU_COEFFICIENTS`, default 5 steps), one ``(a, b, c)`` triple
        (repeated ``steps`` times, default 5), a table ``[(a, b, c), ...]``
        (``steps`` defaults to its length; more steps repeat the last row), or
        a callable, returned unchanged. A named table with ``steps`` below its
        length uses its first ``steps`` rows, the convention of the published
        Polar Express code (``coeffs_list[:steps]``; Amsel et al. 2025): the
        ``N``-step Polar Express table is the first ``N`` rows of the 8-step
        one, except that the safety factor is not applied to its last row.
      steps: number of iterations.
      compute_dtype: the iteration's dtype, for ``'auto'`` (``None``: the
        backend's default, ``default_compute_dtype``).

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
      ``HALF_PRECISION_RESTART_EVERY`` = 2 steps (as in Dao-AILab's
      gram-newton-schulz, which runs in float16);
    * bfloat16 (7 bits): every step but the last two (``1 .. steps - 2``):
      a bfloat16 Gram matrix cannot resolve the small eigenvalues ``sigma^2``
      of the first steps (docs/math.md, "Orthogonalization at fewer flops").

    The bfloat16 default of ``coefficients='auto'`` does not use this schedule:
    :func:`~spectral_optax.expert.power4_schedule` passes its own, ``(1,)``, to :func:`~spectral_optax.newton_schulz`.

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
    """The variant :func:`~spectral_optax.newton_schulz` runs for an ``m x n`` matrix: ``'standard'`` or ``'gram'``.

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
    there; with ``coefficients='auto'``, :func:`~spectral_optax.newton_schulz` passes
    :func:`~spectral_optax.expert.power4_schedule`'s method instead (``'gram'`` on aspect >=
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
