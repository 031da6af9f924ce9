"""The polar iteration: odd matrix polynomials that approximate ``U V^T`` without an SVD.

For a matrix ``G = U S V^T`` (thin SVD) the orthogonal polar factor ``U V^T`` is the
steepest-descent direction under the spectral norm (the RMS->RMS dual map, docs/math.md
section 3). :func:`newton_schulz` approximates it by iterating odd quintics on a normalized
start (docs/math.md section 4)::

    X_0 = G / (||G||_F * safety)                 (so every sigma_i(X_0) <= 1)
    A_k = X_k X_k^T,   X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k

An odd polynomial acts on the singular values only, so after ``K`` steps the result is
``U p_K(...p_1(S)) V^T``; the tables are in :mod:`~spectral_optax._duals.polar.coefficients`,
the defaults in :mod:`~spectral_optax._duals.polar.policy`.

The iteration is batched over leading axes; the Gram product is formed on the short side of
each matrix (``X X^T`` when wide, ``X^T X`` when tall) with ``dot_general`` dimension numbers
instead of materialized transposes. The Gram-space variant (:func:`_gram`) iterates on the
``m x m`` Gram matrix and multiplies by ``X`` once per segment. The start can be scaled by the
Frobenius norm, the Schatten-4 norm, AOL's diagonal or a power-iteration estimate of the
largest singular value (:func:`_precondition`; docs/math.md, "Orthogonalization at fewer
flops"). With ``axis_name`` (inside ``shard_map``) a matrix split along its long side is
iterated block by block, its Gram matrix summed over the devices every step
(:func:`~spectral_optax._mesh.collectives.psum_symmetric`).

References:
  Jordan et al. (2024), Muon; Amsel et al. (2025), The Polar Express;
  Turbo-Muon (2025), arXiv:2512.04632 (AOL preconditioning); Dao-AILab's
  gram-newton-schulz (Gram-space restarts). docs/math.md section 4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from spectral_optax._duals.polar.coefficients import POWER_SAFETY, Coefficients
from spectral_optax._duals.polar.policy import (
    POWER_ITERATIONS,
    POWER_STARTS,
    PRECONDITIONINGS,
    _use_gram,
    auto_schedule,
    default_compute_dtype,
    default_preconditioning,
    gram_restarts,
    resolve_coefficients,
    resolve_precision,
    user_function_dtype,
)
from spectral_optax._mesh.collectives import psum_symmetric

__all__ = ["POWER_GUARD", "newton_schulz"]

#: The ``'power'`` start's guard: a result with ``||Y||_F^2 > POWER_GUARD^2 *
#: min(m, n)`` (the top of the ``[0.6, 1.25]`` band on every singular value),
#: or not finite, is replaced by the start ``X_0`` itself (its singular values
#: ``sigma_i / N``: a scaled gradient, finite and in the gradient's direction).
#: It costs one reduction per matrix and only acts on an estimate that
#: missed by more than the tables tolerate.
POWER_GUARD: float = 1.25


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


def _precondition(x, preconditioning: str, safety: float, wide: bool, precision, psum, square=None):
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
    matmul. ``square``: how ``B^2`` is formed (default ``B B``; the split
    Gram-space iteration forms it by columns, :func:`_columns_over`).
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
        sq = _dot(b, b, 2, 1, precision) if square is None else square(b)
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
    (in bfloat16, rounding ``a X_0`` (``a ~ 8``) and the polynomial's terms (a sum
    ``~ 1``) separately costs the sum its low bits, and the steep tables amplify the
    error; docs/lab_log.md). Returns ``X_1`` and the remaining rows."""
    a, b, c = table[0]
    f32 = jnp.promote_types(x.dtype, jnp.float32)
    poly = (b * gram0.astype(f32) + c * sq0.astype(f32)).astype(x.dtype)
    lhs, rhs = (poly, x) if wide else (x, poly)  # P X (wide) or X P (tall), as ``_apply``
    px = jax.lax.dot_general(lhs, rhs, (((2,), (1,)), ((0,), (0,))), precision=precision, preferred_element_type=f32)
    return (a * x.astype(f32) + px).astype(x.dtype), table[1:]


def _standard(x, table, wide: bool, precision, axis_name=None, gram0=None):
    """``X <- a X + (b A + c A^2) X`` with ``A`` on the short side (with
    ``axis_name``: on the side that contracts the split axis, summed over it by
    :func:`~spectral_optax.expert.psum_symmetric`);
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


def _columns_over(axis_name, m: int):
    """``(m', pad, cols, gather)`` for ``m x m`` products split by columns over ``axis_name``
    (``k`` devices): ``m' = k ceil(m / k)``; ``pad`` zero-pads a batch of ``m x m`` matrices to
    ``m' x m'``; ``cols`` takes this device's ``m' / k`` columns; ``gather`` all-gathers the
    devices' columns into the whole matrix."""
    names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
    k = math.prod(jax.lax.axis_size(a) for a in names)
    mp = -(-m // k) * k
    w = mp // k
    start = jax.lax.axis_index(tuple(names) if len(names) > 1 else names[0]) * w
    pad = lambda a: a if mp == m else jnp.pad(a, ((0, 0), (0, mp - m), (0, mp - m)))
    cols = lambda a: jax.lax.dynamic_slice_in_dim(a, start, w, axis=2)
    gather = lambda b: jax.lax.all_gather(b, axis_name, axis=2, tiled=True)
    return mp, pad, cols, gather


def _split_square(axis_name, m: int, precision):
    """``B -> B^2`` for a batch of symmetric ``m x m`` matrices ``B`` whole on every device of
    ``axis_name``, formed by columns (``B B[:, J]``, ``2 m^3 / k`` flops) and all-gathered."""
    mp, pad, cols, gather = _columns_over(axis_name, m)
    return lambda b: gather(_dot(pad(b), cols(pad(b)), 2, 1, precision))[:, :m, :m]


def _gram_split(x, table, precision, axis_name, restarts: Sequence[int] = (), gram0=None, sq0=None):
    """:func:`_gram` on a wide matrix split in column blocks over ``axis_name`` (``k`` devices),
    the ``m x m`` work split too.

    Each device holds ``X_b`` (``m x c``). ``R_0 = sum_b X_b X_b^T`` is summed once per segment
    (:func:`~spectral_optax._mesh.collectives.psum_symmetric`); every ``m x m`` matrix is then
    formed by columns: device ``i`` computes the columns ``J_i`` (``m' / k`` of them, ``m`` padded
    to ``m' = k ceil(m / k)`` with zeros) of ``R^2``, ``P = a I + b R + c R^2``, ``Q <- P Q`` and
    ``R <- P R P`` from the whole ``R`` and ``P`` (``P R P[:, J] = P (R P[:, J])``), and
    all-gathers ``P`` and ``R`` (two all-gathers of ``m'^2`` elements per step, one of ``Q`` per
    segment) where a whole one is needed. Flops per device for ``K`` steps in ``j`` segments:
    ``j 4 m^2 c + 2 m'^3 (4 K - 3 j) / k`` (:func:`_gram`'s, the ``m^3`` part divided by
    ``k``). The products are :func:`_gram`'s, column by column, so the result equals the
    one-device iteration up to rounding. (A ``'power'`` start's ``B^2`` is formed by columns
    too, :func:`_split_square`: one more all-gather.)
    """
    m = x.shape[-2]
    mp, pad, cols, gather = _columns_over(axis_name, m)
    mm = lambda a, b: _dot(a, b, 2, 1, precision)
    form = lambda x: pad(_form_gram(x, True, precision, lambda a: psum_symmetric(a, axis_name)))
    gram = pad(gram0) if gram0 is not None else form(x)
    eye_b = cols(jnp.eye(mp, dtype=gram.dtype)[None])
    qb = None
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        if i in restarts and qb is not None:
            x = mm(gather(qb)[:, :m, :m], x)
            gram, qb = form(x), None
        rb = cols(gram)
        square_b = cols(pad(sq0)) if i == 0 and sq0 is not None else mm(gram, rb)
        poly_b = a * eye_b + b * rb + c * square_b
        more = i < last and i + 1 not in restarts
        poly = gather(poly_b) if (qb is not None or more) else None
        qb = poly_b if qb is None else mm(poly, qb)
        if more:
            gram = gather(mm(poly, mm(gram, poly_b)))
            gram = 0.5 * (gram + jnp.swapaxes(gram, 1, 2))
    return mm(gather(qb)[:, :m, :m], x)


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
      coefficients: ``'auto'`` (default, :func:`~spectral_optax.expert.auto_schedule`:
        ``'quintic'`` for >= 32-bit compute, ``'power4'`` by shape for
        bfloat16, ``'polar_express_schatten'`` for float16; with ``axis_name`` the whole matrix's shape
        is the one passed to it), ``'quintic'`` (:data:`~spectral_optax.expert.MUON_QUINTIC`, 5 steps),
        ``'polar_express'`` (:func:`~spectral_optax.expert.polar_express_coefficients`, 8 steps by
        default), ``'polar_express_schatten'`` (4 steps, for the
        Schatten-4-normalized start), ``'power3'`` (3 steps, for the
        ``'power'`` start), ``'power4'`` (4 steps, the same start), ``'you'`` (alias ``'dion'``,
        :data:`~spectral_optax.expert.YOU_COEFFICIENTS`, 5 steps), an ``(a, b, c)`` triple, a table
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
        ``coefficients='auto'``, :func:`~spectral_optax.expert.power4_schedule`, asks for it by shape).
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
        iteration (standard method). With ``method='gram'`` and split
        columns the Gram-space iteration runs instead, its ``m x m`` work
        split over the devices too (``X X^T`` summed once per segment, the
        ``m x m`` products formed by columns and all-gathered; the result
        equals the unsharded Gram-space iteration); ``'auto'`` means
        standard here. ``None``: ``x`` holds whole matrices.
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
        ``coefficients='auto'`` the schedule's own, :func:`~spectral_optax.expert.auto_schedule`,
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
    requested = method  # with axis_name: 'gram' asks for the split Gram-space iteration (_gram_split)
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
        split_gram = requested == "gram" and wide  # the Gram-space iteration, its m x m work split too
        x0, gram0, sq0 = _precondition(
            xc, preconditioning, 1.0 if frobenius else safety, wide, prec, lambda a: psum_symmetric(a, axis_name),
            _split_square(axis_name, m, prec) if split_gram else None,
        )  # fmt: skip
        xc = x0
        if split_gram:
            if restarts is None and auto_restarts is not None:
                restarts = tuple(i for i in auto_restarts if i < steps_)
            rs = gram_restarts(steps_, cdtype, prec, restarts)
            if sq0 is not None and (1 in rs or steps_ == 1):  # the first step in X-space, as below
                xc, table = _first_step(xc, table, wide, prec, gram0, sq0)
                gram0 = sq0 = None
                rs = tuple(i - 1 for i in rs if i > 1)
            y = _gram_split(xc, table, prec, axis_name, rs, gram0, sq0) if table else xc
        else:
            if sq0 is not None:
                xc, table = _first_step(xc, table, wide, prec, gram0, sq0)
                gram0 = None
            y = _standard(xc, table, wide, prec, axis_name, gram0)
    else:
        psum = lambda a: a
        use_gram = _use_gram(method, m, n, steps_, cdtype, prec)
        # Gram space on a tall matrix runs on its transpose (NS(G^T) = NS(G)^T), in the wide form
        # ``X X^T`` / ``Q X``, which holds the band in bfloat16 where ``X^T X`` / ``X Q`` does not
        # (docs/lab_log.md).
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
