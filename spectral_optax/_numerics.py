"""Overflow- and underflow-safe norms shared by the dual maps.

Every norm is computed on magnitudes divided by their maximum (per reduced
slice), in float32 or wider, so inputs from 1e-30 to 1e30 and bf16 give
finite results; an all-zero slice has norm 0 and normalizes to 0.
"""

from __future__ import annotations

import jax.numpy as jnp


def compute_dtype(x):
    """float32 for low-precision inputs, the input's dtype otherwise."""
    return jnp.promote_types(x.dtype, jnp.float32)


def safe_max_abs(x, axis, keepdims=True):
    """``max |x|`` over ``axis``, replaced by 1 where it is 0 (so dividing by it is safe)."""
    scale = jnp.max(jnp.abs(x), axis=axis, keepdims=keepdims)
    return jnp.where(scale > 0, scale, jnp.ones_like(scale))


def rms_normalize(x, axis):
    """``x / RMS(x)`` over ``axis`` (RMS = sqrt(mean x^2)); zero slices stay zero.

    Computed as ``y / RMS(y)`` with ``y = x / max|x|``, which is exact and
    cannot overflow or underflow.
    """
    x = x.astype(compute_dtype(x))
    y = x / safe_max_abs(x, axis)
    rms = jnp.sqrt(jnp.mean(y * y, axis=axis, keepdims=True))
    return y / jnp.where(rms > 0, rms, jnp.ones_like(rms))


def unit_frobenius(x, axis):
    """``x / ||x||_F`` over ``axis``; zero slices stay zero (overflow-safe)."""
    x = x.astype(compute_dtype(x))
    y = x / safe_max_abs(x, axis)
    norm = jnp.sqrt(jnp.sum(y * y, axis=axis, keepdims=True))
    return y / jnp.where(norm > 0, norm, jnp.ones_like(norm))
