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
* any user table ``[(a, b, c), ...]`` or a user function replacing the whole
  iteration.

Implementation notes (see :func:`newton_schulz`): the iteration is batched
over leading axes; the Gram product is formed on the short side of each
matrix (``X X^T`` when wide, ``X^T X`` when tall) with ``dot_general``
dimension numbers instead of materialized transposes; for clearly
rectangular matrices in float32 a Gram-space variant iterates on the
``m x m`` Gram matrix and multiplies by ``X`` once at the end.

Precision on accelerators (see :func:`resolve_precision`,
:func:`newton_schulz_method`): the default compute dtype is bfloat16 on
GPU/TPU and float32 elsewhere; float32 compute runs its matmuls at
``Precision.HIGHEST`` unless told otherwise, so float32 results agree across
backends, and the Gram-space variant is used only at that precision.

References:
  Jordan et al. (2024), "Muon: An optimizer for hidden layers in neural
  networks" (modded-nanogpt).
  Amsel, Persson, Musco, Gower (2025), "The Polar Express: Optimal Matrix Sign
  Methods and Their Application to the Muon Algorithm", arXiv:2505.16932.
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
    "MUON_QUINTIC",
    "POLAR_EXPRESS_CUSHION",
    "POLAR_EXPRESS_L",
    "POLAR_EXPRESS_SAFETY",
    "newton_schulz",
    "newton_schulz_flops",
    "newton_schulz_method",
    "optimal_quintic",
    "polar_express_coefficients",
    "resolve_coefficients",
    "resolve_precision",
    "user_function_dtype",
]

#: The original Muon quintic (Jordan 2024), used for 5 steps.
MUON_QUINTIC: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)

#: Pinned Polar Express parameters of the published 8-step table
#: (lower end of the singular-value interval, cushion, safety factor).
POLAR_EXPRESS_L: float = 1e-3
POLAR_EXPRESS_CUSHION: float = 0.02407327424182761
POLAR_EXPRESS_SAFETY: float = 1.01

Triple = tuple[float, float, float]
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


def resolve_coefficients(coefficients: Coefficients = "quintic", steps: int | None = None):
    """Turn a coefficient spec into ``(table, norm_safety)`` or a callable.

    Args:
      coefficients: ``'quintic'`` (:data:`MUON_QUINTIC`, default 5 steps),
        ``'polar_express'`` (:func:`polar_express_coefficients` with ``steps``
        polynomials, default 8), one ``(a, b, c)`` triple (repeated ``steps``
        times, default 5), a table ``[(a, b, c), ...]`` (``steps`` defaults to
        its length; more steps repeat the last row), or a callable, returned
        unchanged.
      steps: number of iterations.

    Returns:
      ``(tuple of (a, b, c), normalization safety factor)``, or the callable.
    """
    if callable(coefficients):
        return coefficients
    if steps is not None and int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if isinstance(coefficients, str):
        name = coefficients.lower().replace("-", "_").replace(" ", "_")
        if name in ("quintic", "muon", "standard"):
            return (MUON_QUINTIC,) * int(steps or 5), 1.0
        if name in ("polar_express", "polarexpress", "pe"):
            return polar_express_coefficients(int(steps or 8)), POLAR_EXPRESS_SAFETY
        raise ValueError(
            f"unknown coefficients {coefficients!r}; use 'quintic', 'polar_express', a table "
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


def _standard(x, table, wide: bool, precision, axis_name=None):
    """``X <- a X + (b A + c A^2) X`` with ``A`` on the short side (with
    ``axis_name``: on the side that contracts the split axis, ``psum``-ed)."""
    psum = (lambda a: a) if axis_name is None else (lambda a: jax.lax.psum(a, axis_name))
    for a, b, c in table:
        if wide:  # (B, m, n), m <= n: A = X X^T (m x m), update B X.
            gram = psum(_dot(x, x, 2, 2, precision))
            poly = b * gram + c * _dot(gram, gram, 2, 1, precision)
            x = a * x + _dot(poly, x, 2, 1, precision)
        else:  # tall: A = X^T X (n x n), update X B.
            gram = psum(_dot(x, x, 1, 1, precision))
            poly = b * gram + c * _dot(gram, gram, 2, 1, precision)
            x = a * x + _dot(x, poly, 2, 1, precision)
    return x


def _gram(x, table, wide: bool, precision):
    """Gram-space iteration: iterate on the small Gram matrix, apply to X once.

    With ``R_0 = X X^T`` (short side) every ``R_k`` and every step polynomial
    ``P_k = a I + b R_k + c R_k^2`` are polynomials in ``R_0``, so they commute::

        X_K = Q X_0,   Q = P_{K-1} ... P_0,   R_{k+1} = P_k R_k P_k.

    Flops for an ``m x n`` matrix (``m <= n``), ``K`` steps: ``4 m^2 n`` for the
    two products with ``X`` plus ``2 m^3 (4 K - 3)`` for the Gram-space
    products, against ``K (4 m^2 n + 2 m^3)`` for the standard iteration.
    """
    if wide:
        gram = _dot(x, x, 2, 2, precision)
    else:
        gram = _dot(x, x, 1, 1, precision)
    k = gram.shape[-1]
    eye = jnp.eye(k, dtype=gram.dtype)
    q = None
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        poly = a * eye + b * gram + c * _dot(gram, gram, 2, 1, precision)
        q = poly if q is None else _dot(poly, q, 2, 1, precision)
        if i < last:
            gram = _dot(_dot(gram, poly, 2, 1, precision), poly, 2, 1, precision)
            # Restore exact symmetry lost to round-off (cheap, elementwise).
            gram = 0.5 * (gram + jnp.swapaxes(gram, 1, 2))
    return _dot(q, x, 2, 1, precision) if wide else _dot(x, q, 2, 1, precision)


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


def newton_schulz_method(
    m: int, n: int, steps: int, dtype=jnp.float32, method: str = "auto", precision: Any = None
) -> str:
    """The variant :func:`newton_schulz` runs for an ``m x n`` matrix: ``'standard'`` or ``'gram'``.

    The Gram-space variant has no self-correction through ``X``: the round-off
    of every Gram-space product accumulates in ``Q`` (in bfloat16 it is
    unstable; at TensorFloat-32, 10 mantissa bits, Polar Express 8 steps was
    measured 0.29 away from 1 on an NVIDIA H200, against < 1e-4 at float32).
    So ``'auto'`` picks it only when

    * the compute ``dtype`` has >= 32 bits **and** the matmuls run at
      ``Precision.HIGHEST`` (:func:`resolve_precision`: the default for
      float32 compute; an explicit lower ``precision`` such as
      ``'tensorfloat32'`` or ``Precision.DEFAULT`` disables it on every
      backend, even on a CPU where it would be exact, so that the choice,
      and the result, do not depend on the backend), and
    * it saves at least 25% of the flops (:func:`newton_schulz_flops`).
    """
    if method in ("standard", "gram"):
        return method
    if jnp.dtype(dtype).itemsize < 4 or not _is_full_precision(resolve_precision(precision, dtype)):
        return "standard"
    gram = newton_schulz_flops(m, n, steps, "gram")
    return "gram" if gram <= 0.75 * newton_schulz_flops(m, n, steps, "standard") else "standard"


def _use_gram(method: str, m: int, n: int, steps: int, dtype, precision: Any = None) -> bool:
    return newton_schulz_method(m, n, steps, dtype, method, precision) == "gram"


def newton_schulz_flops(m: int, n: int, steps: int, method: str = "standard") -> int:
    """Matmul flops of one ``m x n`` orthogonalization (2 flops per multiply-add).

    Standard: ``steps * (4 s^2 l + 2 s^3)``; Gram-space: ``4 s^2 l + 2 s^3 (4
    steps - 3)``, with ``s = min(m, n)``, ``l = max(m, n)``.
    """
    s, l = min(m, n), max(m, n)
    if method == "gram":
        return 4 * s * s * l + 2 * s**3 * max(4 * steps - 3, 1)
    return steps * (4 * s * s * l + 2 * s**3)


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
    coefficients: Coefficients = "quintic",
    *,
    steps: int | None = None,
    compute_dtype: Any = None,
    method: str = "auto",
    norm_safety: float | None = None,
    precision: Any = None,
    axis_name: Any = None,
    sharded_axis: int = -1,
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
      coefficients: ``'quintic'`` (default: :data:`MUON_QUINTIC`, 5 steps),
        ``'polar_express'`` (:func:`polar_express_coefficients`, 8 steps by
        default), an ``(a, b, c)`` triple, a table of triples, or a function
        ``f(x) -> x`` replacing the normalization and iteration altogether,
        e.g. an exact SVD-based polar factor. It is called on the
        ``(batch, m, n)`` array in :func:`user_function_dtype` (``compute_dtype``
        promoted to at least float32, so float32 under the bfloat16 default of
        GPUs/TPUs: ``jnp.linalg.svd`` rejects bfloat16) and, unless
        ``precision`` is given, traced under
        ``jax.default_matmul_precision('highest')``.
      steps: number of iterations (see :func:`resolve_coefficients`).
      compute_dtype: dtype of the iteration. ``None``: float32 on CPU,
        bfloat16 on GPU/TPU. The result is cast back to ``x.dtype``.
        ``float32`` means float32 arithmetic on every backend: unless
        ``precision`` says otherwise its matmuls run at ``Precision.HIGHEST``
        (a GPU's default for float32 is TensorFloat-32, 10 mantissa bits, and
        a TPU's a single bfloat16 pass). That is several times slower on
        tensor cores than bfloat16; for speed use the bfloat16 default, or
        ``precision='tensorfloat32'`` (then ``'auto'`` never picks ``'gram'``).
      method: ``'standard'``, ``'gram'`` (Gram-space variant, cheaper for
        rectangular matrices) or ``'auto'`` (:func:`newton_schulz_method`:
        Gram-space when ``compute_dtype`` has >= 32 bits, the matmuls run at
        ``Precision.HIGHEST``, and it saves >= 25% of the flops, i.e. aspect
        ratio ``max(m, n) / min(m, n) >= 2.5`` for 5 steps).
      norm_safety: factor ``>= 1`` on the Frobenius norm; ``None``: 1.01 for
        ``'polar_express'`` (as published), 1 otherwise.
      precision: ``jax.lax.Precision`` (or string, or pair) of the matmuls;
        ``None``: :func:`resolve_precision` (``HIGHEST`` for >= 32-bit
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
    xn = xn / jnp.where(fro > 0, fro * safety, 1).astype(ndtype)
    xc = xn.astype(cdtype)

    prec = resolve_precision(precision, cdtype)
    if axis_name is not None:
        y = _standard(xc, table, sharded_axis == -1, prec, axis_name)
        return y.astype(out_dtype).reshape(x.shape)
    wide = m <= n
    if _use_gram(method, m, n, len(table), cdtype, prec):
        y = _gram(xc, table, wide, prec)
    else:
        y = _standard(xc, table, wide, prec)
    return y.astype(out_dtype).reshape(x.shape)
