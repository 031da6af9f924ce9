"""Collectives of the distributed orthogonalization.

:func:`psum_symmetric` sums a batch of symmetric (Gram) matrices over mapped axes sending
their upper triangles only: ``s (s + 1) / 2`` elements per ``s x s`` matrix instead of ``s^2``
(docs/sharding.md; the plan's cost model counts these bytes, :func:`spectral_optax._distributed.plan.triangle`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["psum_symmetric"]


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
