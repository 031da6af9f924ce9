"""Overflow- and underflow-safe numerics shared by the dual maps and the diagnostics.

Every norm is computed on magnitudes divided by their maximum (per reduced
slice), in float32 or wider, so inputs from 1e-30 to 1e30 and bf16 give
finite results; an all-zero slice has norm 0 and normalizes to 0. The
largest singular value is estimated by one power iteration shared by the
spectral dual map (warm-started, a few steps per update) and the diagnostics
(cold-started, many steps).

Inside ``shard_map`` the reduced axes of an array may be split over mesh
axes: pass their names as ``axis_name`` and every max becomes a
``lax.pmax`` and every sum a ``lax.psum`` over them, so the result equals
the one on the whole array. Without ``axis_name`` the block on each device
is taken for the whole array (local-only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spectral_optax._mesh.layout import on_auto_axes


def compute_dtype(x):
    """float32 for low-precision inputs, the input's dtype otherwise."""
    return jnp.promote_types(x.dtype, jnp.float32)


def static_value(x) -> float | None:
    """``float(x)`` when ``x`` is a concrete Python/NumPy number or array, else ``None`` (a tracer)."""
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def _nonzero(x):
    return jnp.where(x > 0, x, jnp.ones_like(x))


def _pmax(x, axis_name):
    return x if axis_name is None else jax.lax.pmax(x, axis_name)


def _psum(x, axis_name):
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _count(x, axis, axis_name):
    """Number of entries reduced over ``axis`` (on every shard together)."""
    axes = range(x.ndim) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n if axis_name is None else n * jax.lax.psum(1, axis_name)


def safe_max_abs(x, axis, keepdims=True, *, axis_name=None):
    """``max |x|`` over ``axis`` (and the shards of ``axis_name``), replaced by 1 where it is 0."""
    return _nonzero(_pmax(jnp.max(jnp.abs(x), axis=axis, keepdims=keepdims), axis_name))


def safe_norm(x, axis=None, *, axis_name=None):
    """l2 / Frobenius norm over ``axis`` computed as ``max|x| * ||x / max|x|||`` (no overflow)."""
    x = x.astype(compute_dtype(x))
    peak = safe_max_abs(x, axis, axis_name=axis_name)
    y = x / peak
    return jnp.squeeze(peak, axis) * jnp.sqrt(_psum(jnp.sum(y * y, axis=axis), axis_name))


def rms_normalize(x, axis, *, axis_name=None):
    """``x / RMS(x)`` over ``axis`` (RMS = sqrt(mean x^2)); zero slices stay zero.

    Computed as ``y / RMS(y)`` with ``y = x / max|x|``, which is exact and
    cannot overflow or underflow.
    """
    x = x.astype(compute_dtype(x))
    y = x / safe_max_abs(x, axis, axis_name=axis_name)
    mean = _psum(jnp.sum(y * y, axis=axis, keepdims=True), axis_name) / _count(y, axis, axis_name)
    return y / _nonzero(jnp.sqrt(mean))


def unit_frobenius(x, axis, *, axis_name=None):
    """``x / ||x||_2`` over ``axis`` (Frobenius for two axes); zero slices stay zero (overflow-safe)."""
    x = x.astype(compute_dtype(x))
    y = x / safe_max_abs(x, axis, axis_name=axis_name)
    return y / _nonzero(jnp.sqrt(_psum(jnp.sum(y * y, axis=axis, keepdims=True), axis_name)))


def unit_vectors(v, fallback):
    """``v / ||v||`` along the last axis; ``fallback`` where ``v`` is zero."""
    norm = jnp.linalg.norm(v, axis=-1, keepdims=True)
    return jnp.where(norm > 0, v / _nonzero(norm), fallback)


def power_iteration(m: jax.Array, v: jax.Array, num_iterations: int):
    """Top singular value of every slice by power iteration on ``G^T G``.

    Args:
      m: ``(num_slices, d_in, d_out)``.
      v: ``(num_slices, d_out)`` starting right vectors (warm start).
      num_iterations: number of ``v <- G^T G v / ||G^T G v||`` steps.

    Returns:
      ``(sigma, v)``: ``sigma = ||G v||`` of shape ``(num_slices,)`` and the
      updated unit right vectors. A zero slice gives ``sigma = 0`` and keeps
      its vector.
    """

    # Explicit meshes: the contractions run over sharded axes, the vectors come back replicated.
    def run(m, v, num_iterations):
        m = m.astype(compute_dtype(m))
        v = unit_vectors(v.astype(m.dtype), v.astype(m.dtype))

        def body(_, v):
            u = jnp.einsum("bio,bo->bi", m, v)
            return unit_vectors(jnp.einsum("bio,bi->bo", m, u), v)

        v = jax.lax.fori_loop(0, num_iterations, body, v)
        return jnp.linalg.norm(jnp.einsum("bio,bo->bi", m, v), axis=-1), v

    return on_auto_axes(run, m, v, num_iterations, num_outputs=2)


def top_singular_value(m: jax.Array, method: str = "auto", iters: int = 100) -> jax.Array:
    """Largest singular value of each slice of ``m`` ``(num_slices, d_in, d_out)``.

    ``method``: ``'svd'`` (exact), ``'power'`` (``iters`` cold-started power
    iterations on the shorter side) or ``'auto'`` (SVD up to min dimension
    1024). Each slice is divided by its largest entry first (no overflow).
    """
    if method == "auto":
        method = "svd" if min(m.shape[-2:]) <= 1024 else "power"
    if method not in ("svd", "power"):
        raise ValueError(f"method must be 'svd', 'power' or 'auto', got {method!r}")
    m = m.astype(compute_dtype(m))
    peak = safe_max_abs(m, axis=(-2, -1))
    y = m / peak
    if method == "svd":
        top = jnp.linalg.svd(y, compute_uv=False)[..., 0]
    else:
        if y.shape[-2] < y.shape[-1]:
            y = jnp.swapaxes(y, -1, -2)
        n = y.shape[-1]
        v0 = jnp.broadcast_to(1.0 + 1e-3 * jnp.arange(n, dtype=y.dtype), y.shape[:-2] + (n,))
        top, _ = power_iteration(y, v0, iters)
    return peak[..., 0, 0] * top
