"""Spectral-norm normalization of matrices (the RMS -> RMS geometry, cheap form).

For a matrix gradient ``G`` (canonical view ``(num_slices, d_in, d_out)``)
the spectral condition asks for an update with spectral norm
``sqrt(d_out / d_in)``:

    D = sqrt(d_out / d_in) * G / ||G||_*.

``||G||_*`` (largest singular value) is either replaced by the Frobenius
norm ``||G||_F >= ||G||_*`` (cheap; equal for rank-1 gradients, and close
because gradients have low stable rank) or estimated by power iteration on
``G^T G`` with right singular vectors warm-started from the previous step.
The full orthogonalization ``U V^T`` lives in :mod:`spectral_optax._duals.polar`.

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature
  Learning", section 3 (normalized updates). docs/math.md section 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spectral_optax._numerics import (
    compute_dtype,
    power_iteration,
    safe_max_abs,
    unit_frobenius,
)


def frobenius_normalize(m: jax.Array, *, axis_name=None) -> jax.Array:
    """``G / ||G||_F`` per slice of ``(num_slices, d_in, d_out)``; zero stays zero.

    Inside ``shard_map``, ``axis_name`` names the mesh axes splitting the
    matrix axes of ``m`` (either or both): the norm is reduced over them.
    """
    return unit_frobenius(m, axis=(-2, -1), axis_name=axis_name).astype(m.dtype)


def spectral_normalize_power(m: jax.Array, v: jax.Array, num_iterations: int):
    """``G / sigma_max(G)`` per slice with a warm-started power iteration.

    The matrix is first divided by its largest entry (exact and overflow
    safe). Returns ``(normalized, v)``; zero slices give zero.
    """
    mc = m.astype(compute_dtype(m))
    mc = mc / safe_max_abs(mc, axis=(-2, -1))
    sigma, v = power_iteration(mc, v, num_iterations)
    sigma = sigma[:, None, None]
    out = mc / jnp.where(sigma > 0, sigma, 1.0)
    return out.astype(m.dtype), v
