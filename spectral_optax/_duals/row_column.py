"""Row-wise and column-wise dual maps: steepest descent under (p,mean)->inf
and (1,mean)->(q,mean) operator norms, plus sign descent.

All functions act on the canonical view ``m`` of shape
``(num_slices, d_in, d_out)`` produced by :func:`spectral_optax.expert.to_matrix`
(Flax layout ``y = x @ W``): axis 1 is the fan-in, axis 2 the fan-out. Each
slice (stacked layer, QKV block, ...) is treated independently.

**Row dual, (p,mean) -> inf.** With ``||x||_{p,mean} = d_in^{-1/p} ||x||_p``,
``||W||_{(p,mean)->inf} = d_in^{1/p} max_i ||w_i||_{p*}`` where ``w_i`` is the
fan-in vector of output neuron ``i`` (a *column* of a Flax kernel, a *row*
of a PyTorch weight) and ``p* = p/(p-1)``. The steepest-descent direction
``argmax_{||D|| <= 1} <G, D>`` is, for every output ``i``,

    d_i = sign(g_i) |g_i|^(p-1) / ||g_i||_p^(p-1) * d_in^(-1/p),

so ``||d_i||_{p*} = d_in^(-1/p)``, ``||D||_{(p,mean)->inf} = 1`` and
``<g_i, d_i> = d_in^(-1/p) ||g_i||_p``. ``p = 1`` gives ``sign(G) / d_in``.

**Column dual, (1,mean) -> (q,mean).** ``||W||_{(1,mean)->(q,mean)} =
d_in d_out^(-1/q) max_j ||h_j||_q`` with ``h_j`` the fan-out vector of input
``j``; the direction is, with ``q* = q/(q-1)``,

    d_j = sign(h_j) |h_j|^(q*-1) / ||h_j||_{q*}^(q*-1) * d_out^(1/q) / d_in.

``q = inf`` gives ``sign(G) / d_in`` again; ``q = 2`` gives every fan-out
vector RMS ``1/d_in``.

**Numerics.** Every power is taken of the max-normalized magnitude
``a = |g| / max|g|`` (per reduced vector, computed in float32 or wider), so
``a`` lies in ``[0, 1]``, ``sum a^p >= 1`` whenever the vector is nonzero, and
1e-30 / 1e30 / bf16 inputs give finite results; the direction is invariant to
that rescaling. How ``p`` is handled numerically:

* ``p = 1`` (static): ``sign(g)`` exactly; ``p = 2``: ``y = g / max|g|``,
  ``y / ||y||_2`` (no powers at all).
* The output factor ``a^(p-1)``: for static integer and half-integer ``p``
  (1.5, 2.5, 3, ...) integer multiplications and at most one ``sqrt``; for
  other static ``p`` and for traced ``p`` (``inject_hyperparams``)
  ``exp((p-1) log a)``, set to 0 where ``a = 0`` (multiplied by
  ``sign(0) = 0`` anyway).
* The norm ``sum_i a_i^p`` is always ``sum exp(p log a)`` (``log 0 = -inf``
  contributes 0), then ``^((p-1)/p)`` on the reduced vector. A reduction
  whose fused producer reuses a value (``a * sqrt(a)``) compiles to a loop
  ~40x slower on XLA:CPU; ``exp(p log a)`` keeps it a fast reduction.
  Relative error of the sum ~1e-6 in float32.

All-zero vectors map to zero (never NaN).
The result is cast back to the input's dtype.

References:
  Large, Bernstein et al. (2024), "Scalable Optimization in the Modular Norm";
  Bernstein & Newhouse (2024), "Old Optimizer, New Norm";
  Wong, Xu, Li, Lu (2026) (MOGA, p in {1.5, 2, 2.5}). docs/math.md section 3.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from spectral_optax._numerics import (
    compute_dtype,
    safe_max_abs,
    static_value,
    unit_frobenius,
)

__all__ = [
    "check_p",
    "check_q",
    "column_direction",
    "column_normalize",
    "lp_dual_direction",
    "row_direction",
    "row_normalize",
    "sign",
]

Exponent = Any  # float, or a (traced) scalar array under inject_hyperparams


def _powstatic_value(a, e: float):
    """``a**e`` for ``a`` in [0, 1] and a static ``e >= 0``; integer and
    half-integer ``e`` use multiplications and one ``sqrt``."""
    if e == 0.0:
        return jnp.ones_like(a)
    if float(e).is_integer():
        return jax.lax.integer_pow(a, int(e))
    if float(2 * e).is_integer():
        k = math.floor(e)
        root = jnp.sqrt(a)
        return root if k == 0 else jax.lax.integer_pow(a, k) * root
    return _pow_exp_log(a, e)


def _pow_exp_log(a, e):
    """``a**e = exp(e log a)`` for ``a`` in [0, 1]; 0 where ``a = 0`` (the
    caller multiplies by ``sign(x) = 0`` there, so ``0**0`` is immaterial)."""
    positive = a > 0
    return jnp.where(positive, jnp.exp(e * jnp.log(jnp.where(positive, a, 1.0))), 0.0)


def _pow_sum(a, r, axis: int, axis_name=None):
    """``sum(a**r, axis, keepdims=True)`` for ``a`` in [0, 1], ``r > 0``.

    Written as ``exp(r * log(a))`` (``log 0 = -inf`` gives 0) so that every
    element is used once inside the reduction: XLA:CPU emits a slow,
    unvectorized loop for reductions whose fused producer reuses a value
    (e.g. ``a * sqrt(a)``: ~40x slower measured on a 768 x 3072 slice).
    Relative error ~1e-6 on the sum in float32.
    """
    s = jnp.sum(jnp.exp(r * jnp.log(a)), axis=axis, keepdims=True)
    return s if axis_name is None else jax.lax.psum(s, axis_name)


def lp_dual_direction(x: jax.Array, r: Exponent, axis: int, *, axis_name=None) -> jax.Array:
    """``sign(x) |x|^(r-1) / ||x||_r^(r-1)`` along ``axis``, for ``r >= 1``.

    The maximizer of ``<x, d>`` over ``||d||_{r*} <= 1`` (``r* = r/(r-1)``):
    it has unit ``l_{r*}`` norm and ``<x, d> = ||x||_r``. Zero vectors give 0.
    Computed on ``|x| / max|x|`` in float32 or wider (no overflow or
    underflow of the powers);
    returns the compute dtype (callers cast back). Inside ``shard_map``,
    ``axis_name`` names the mesh axes that split ``axis``: the max and the
    sum are then ``pmax`` / ``psum`` over them (the unsharded result).

    Args:
      x: a canonical view ``(num_slices, d_in, d_out)``.
      r: the norm exponent, ``1 <= r < inf``; a Python number (fast paths
        for ``r = 1``: ``sign(x)``, and ``r = 2``: l2 normalization) or a
        traced scalar (``optax.inject_hyperparams``).
      axis: the axis of the vectors: 1 (fan-in vectors, one per fan-out
        index) or 2 (fan-out vectors, one per fan-in index).
      axis_name: inside ``shard_map``, the mesh axes splitting ``axis``;
        ``None``: ``x`` is whole.

    Returns:
      the direction, shape of ``x``, in the compute dtype.
    """
    if x.ndim != 3 or axis not in (1, 2):
        raise ValueError(f"expected a (num_slices, d_in, d_out) array and axis 1 or 2, got {x.shape}, {axis}")
    x = x.astype(compute_dtype(x))
    r_static = static_value(r)
    if r_static == 1.0:
        return jnp.sign(x)
    if r_static == 2.0:  # plain l2 normalization, no powers
        return unit_frobenius(x, axis, axis_name=axis_name)
    a = jnp.abs(x) / safe_max_abs(x, axis, axis_name=axis_name)
    if r_static is not None:
        t = _powstatic_value(a, r_static - 1.0)  # a^(r-1)
        s = _pow_sum(a, r_static, axis, axis_name)  # sum a^r, >= 1 unless zero
        denom = s ** ((r_static - 1.0) / r_static)
    else:
        r = jnp.asarray(r, x.dtype)
        t = _pow_exp_log(a, r - 1.0)
        s = _pow_sum(a, r, axis, axis_name)
        denom = jnp.power(s, (r - 1.0) / r)
    denom = jnp.where(denom > 0, denom, jnp.ones_like(denom))
    return jnp.sign(x) * (t / denom)


def check_p(p, name="p"):
    v = static_value(p)
    if v is not None and not (1.0 <= v < math.inf):
        raise ValueError(f"{name} must be in [1, inf), got {p!r}")


def check_q(q):
    v = static_value(q)
    if v is not None and not (v > 1.0):
        raise ValueError(f"q must be in (1, inf] (q = inf gives sign(G) / d_in), got {q!r}")


def _conjugate(q):
    """``q* = q / (q - 1)``, with ``inf* = 1``."""
    v = static_value(q)
    if v is not None:
        return 1.0 if math.isinf(v) else v / (v - 1.0)
    q = jnp.asarray(q, jnp.float32)
    return jnp.where(jnp.isinf(q), 1.0, q / jnp.where(jnp.isinf(q), 2.0, q - 1.0))


def row_normalize(m: jax.Array, p: Exponent = 2.0, *, fan_scaling: bool = True, axis_name=None) -> jax.Array:
    """Steepest-descent direction of the (p,mean) -> inf norm ("row" / MOGA).

    For every slice and every fan-out index ``i`` (axis 2), the fan-in vector
    ``g_i = m[s, :, i]`` becomes
    ``sign(g_i) |g_i|^(p-1) / ||g_i||_p^(p-1) * d_in^(-1/p)``.

    Args:
      m: canonical view ``(num_slices, d_in, d_out)`` (any float dtype).
      p: input norm exponent, ``1 <= p < inf``; ``p = 1`` is ``sign(m) / d_in``.
      fan_scaling: multiply by ``d_in^(-1/p)`` (True: the exact dual map, unit
        (p,mean)->inf norm); False leaves every fan-in vector at unit
        ``l_{p*}`` norm (MOGA's output-head rule).
      axis_name: inside ``shard_map``, the mesh axes splitting the fan-in
        axis (axis 1): norms are reduced over them and ``d_in`` is the whole
        fan-in. ``None``: ``m`` is the whole matrix.

    Returns:
      The direction, same shape and dtype as ``m``.
    """
    check_p(p)
    _check_canonical("row_normalize", m)
    return row_direction(m, p, fan_scaling=fan_scaling, axis_name=axis_name)


def _check_canonical(name: str, m: jax.Array) -> None:
    if m.ndim != 3:
        raise ValueError(f"{name} expects the canonical (num_slices, d_in, d_out) view, got shape {m.shape}")


def _whole(n: int, axis_name) -> int:
    return n if axis_name is None else n * jax.lax.psum(1, axis_name)


def row_direction(m: jax.Array, p: Exponent, *, fan_scaling: bool = True, axis_name=None) -> jax.Array:
    """:func:`~spectral_optax.expert.row_normalize` without argument checks.

    For transforms that checked ``p`` at construction.
    """
    d = lp_dual_direction(m, p, axis=1, axis_name=axis_name)
    if fan_scaling:
        d_in = _whole(m.shape[1], axis_name)
        pv = static_value(p)
        scale = d_in ** (-1.0 / pv) if pv is not None else jnp.power(float(d_in), -1.0 / jnp.asarray(p, d.dtype))
        d = d * jnp.asarray(scale, d.dtype)
    return d.astype(m.dtype)


def column_normalize(m: jax.Array, q: Exponent = 2.0, *, fan_scaling: bool = True, axis_name=None) -> jax.Array:
    """Steepest-descent direction of the (1,mean) -> (q,mean) norm ("column").

    For every slice and every fan-in index ``j`` (axis 1), the fan-out vector
    ``h_j = m[s, j, :]`` becomes
    ``sign(h_j) |h_j|^(q*-1) / ||h_j||_{q*}^(q*-1) * d_out^(1/q) / d_in``,
    ``q* = q/(q-1)``.

    Args:
      m: canonical view ``(num_slices, d_in, d_out)``.
      q: output norm exponent, ``1 < q <= inf``; ``q = inf`` is ``sign(m) / d_in``.
      fan_scaling: multiply by ``d_out^(1/q) / d_in`` (True: the exact dual
        map, unit (1,mean)->(q,mean) norm); False leaves unit ``l_q`` rows.
      axis_name: as in :func:`~spectral_optax.expert.row_normalize`, for the fan-out axis (axis 2) and ``d_out``.

    Returns:
      The direction, same shape and dtype as ``m``.
    """
    check_q(q)
    _check_canonical("column_normalize", m)
    return column_direction(m, q, fan_scaling=fan_scaling, axis_name=axis_name)


def column_direction(m: jax.Array, q: Exponent, *, fan_scaling: bool = True, axis_name=None) -> jax.Array:
    """:func:`~spectral_optax.expert.column_normalize` without argument checks (``q`` checked at construction)."""
    d = lp_dual_direction(m, _conjugate(q), axis=2, axis_name=axis_name)
    if fan_scaling:
        d_in, d_out = m.shape[1], _whole(m.shape[2], axis_name)
        qv = static_value(q)
        if qv is not None:
            scale = (1.0 if math.isinf(qv) else d_out ** (1.0 / qv)) / d_in
        else:
            scale = jnp.power(float(d_out), 1.0 / jnp.asarray(q, d.dtype)) / d_in
        d = d * jnp.asarray(scale, d.dtype)
    return d.astype(m.dtype)


def sign(m: jax.Array) -> jax.Array:
    """``sign(m)``: the steepest-descent direction of the max-entry norm
    (the (1,mean)->(inf,mean) dual without its ``1/d_in``). Elementwise, so
    it needs no canonical view; dtype preserved, ``sign(0) = 0``."""
    return jnp.sign(m)
