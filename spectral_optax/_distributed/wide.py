"""The wide view of a leaf: its canonical ``(slices, d_in, d_out)`` matrices transposed to
``m <= n`` (``NS(G^T) = NS(G)^T``), the dtype they move in, and the way back (docs/sharding.md)."""

from __future__ import annotations

import jax.numpy as jnp

from spectral_optax._duals.polar.policy import default_compute_dtype
from spectral_optax._geometry import Geometry, from_matrix, to_matrix

__all__ = ["from_wide", "from_wide_each", "move_dtype", "to_wide"]


def to_wide(x, g: Geometry, matrix: bool = False):
    """The canonical view ``(num_slices, d_in, d_out)`` (``x`` itself if ``matrix``), transposed to ``m <= n``."""
    m = x if matrix else to_matrix(x, g)
    return jnp.swapaxes(m, 1, 2) if g.d_in > g.d_out else m


def from_wide(block, g: Geometry, factor, dtype, join=None):
    """``factor * block`` (wide; ``factor`` a number or an array) back in the leaf's shape and
    dtype (by ``join`` when given)."""
    block = (block.astype(jnp.promote_types(block.dtype, jnp.float32)) * factor).astype(dtype)
    if join is not None:
        return join(block)
    if g.d_in > g.d_out:
        block = jnp.swapaxes(block, 1, 2)
    return from_matrix(block, g)


def from_wide_each(block, members, idx, scale_of, xs, out: dict) -> None:
    """Split ``block`` (wide matrices stacked on axis 0) into the leaves ``idx``, in order, ``num_slices``
    matrices each, and set ``out[i] = from_wide(part, g_i, scale_of(g_i), xs[i].dtype)`` (``g_i = members[i][1]``)."""
    start = 0
    for i in idx:
        g = members[i][1]
        out[i] = from_wide(block[start : start + g.num_slices], g, scale_of(g), xs[i].dtype)
        start += g.num_slices


def move_dtype(dtype, compute_dtype, coefficients):
    """Matrices travel in the iteration's dtype when it is narrower (bfloat16 on GPU/TPU)."""
    if callable(coefficients):
        return dtype
    cdtype = jnp.dtype(compute_dtype) if compute_dtype is not None else jnp.dtype(default_compute_dtype())
    return cdtype if cdtype.itemsize < jnp.dtype(dtype).itemsize else dtype
