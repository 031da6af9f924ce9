"""Dealing stacks to whole matrices per device under ``shard_map``, and back: a stack from a 2-D
tiling (:func:`tile_deal`), or several stacks of different shapes and layouts (2-D tiles, columns
over every device: :func:`blocks_of`) sharing the devices one matrix each (:func:`shared_deal`),
one all-to-all each way (docs/sharding.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from spectral_optax._distributed.columns import COLUMNS
from spectral_optax._mesh.layout import mesh_order

__all__ = ["ROWS", "blocks_of", "shared_deal", "tile_deal"]

#: A stack staged with its rows over every device (``P(None, axes, None)``; :func:`blocks_of`).
ROWS = "rows"


def tile_deal(mesh, axes, tiles):
    """``(deal, back)`` under ``shard_map`` on ``mesh``: ``deal(block)`` takes a device's tiles
    ``(B', m / r, n / c)`` of a stack tiled ``P(None, rows, cols)`` to its ``B' / N`` whole
    matrices (one all-to-all over both axes, in mesh order), ``back(y, shape)`` the inverse."""
    names = mesh_order(mesh, axes)  # the all-to-all's device order
    sizes = dict(mesh.shape)
    r, c = sizes[tiles[0]], sizes[tiles[1]]
    rows_first = names[0] == tiles[0]
    n_dev = r * c

    def deal(block):
        b, mr, nc = block.shape
        x = jax.lax.all_to_all(block.reshape(n_dev, b // n_dev, mr, nc), names, 0, 0, tiled=True)
        x = x.reshape(*((r, c) if rows_first else (c, r)), b // n_dev, mr, nc)
        return x.transpose((2, 0, 3, 1, 4) if rows_first else (2, 1, 3, 0, 4)).reshape(b // n_dev, r * mr, c * nc)

    def back(y, shape):
        b, mr, nc = shape
        y = y.reshape(b // n_dev, r, mr, c, nc).transpose((1, 3, 0, 2, 4) if rows_first else (3, 1, 0, 2, 4))
        y = jax.lax.all_to_all(y.reshape(n_dev, b // n_dev, mr, nc), names, 0, 0, tiled=True)
        return y.reshape(b, mr, nc)

    return deal, back


def blocks_of(mesh, axes, staging, shape):
    """``(join, cut)`` for one whole ``m x n`` matrix (``shape``) whose blocks lie on the ``N``
    devices of ``axes`` (in mesh order): ``join(x)`` assembles ``x`` ``(N, *block)``, device ``s``'s
    block at ``s``, into the matrix, ``cut(y)`` is its inverse. ``staging`` is a 2-D tiling
    ``(rows, cols, ...)`` (the matrix tiled ``P(rows, cols)``, blocks ``(m / r, n / c)``),
    ``COLUMNS`` (columns over every device, blocks ``(m, n / N)``) or :data:`ROWS` (rows over
    every device, blocks ``(m / N, n)``)."""
    names = mesh_order(mesh, axes)
    sizes = dict(mesh.shape)
    m, n = shape
    d = int(np.prod([sizes[a] for a in names]))
    if staging == ROWS:
        return (lambda x: x.reshape(m, n)), (lambda y: y.reshape(d, m // d, n))
    if staging == COLUMNS:
        join = lambda x: x.transpose(1, 0, 2).reshape(m, n)
        cut = lambda y: y.reshape(m, d, n // d).transpose(1, 0, 2)
        return join, cut
    r, c = sizes[staging[0]], sizes[staging[1]]
    rows_first = names[0] == staging[0]  # device s holds tile (s // c, s % c), else (s % r, s // r)

    def join(x):
        if rows_first:
            return x.reshape(r, c, m // r, n // c).transpose(0, 2, 1, 3).reshape(m, n)
        return x.reshape(c, r, m // r, n // c).transpose(1, 2, 0, 3).reshape(m, n)

    def cut(y):
        y = y.reshape(r, m // r, c, n // c)
        return y.transpose((0, 2, 1, 3) if rows_first else (2, 0, 1, 3)).reshape(r * c, m // r, n // c)

    return join, cut


def shared_deal(names, counts, sizes, devices: int):
    """``(deal, back)`` under ``shard_map`` for stacks sharing the ``N`` devices one matrix per
    device (``co_place``): stack ``i`` holds ``counts[i]`` matrices, slots after stack ``i - 1``'s,
    and each device holds a block of ``sizes[i]`` elements of each. ``deal(blocks)`` (each
    ``(counts[i], ...)``, or ``None`` for a stack dealt otherwise) sends every block to its
    matrix's slot, flattened and zero-padded to the largest block, by one all-to-all over ``names``,
    and gives the ``(N, L)`` blocks of this device's matrix, from every device in order;
    ``back(received, shapes)`` returns the ``(N, L)`` blocks of the device's result to the devices
    they came from and gives each stack's blocks in ``shapes``. An all-to-all sends equal chunks, so
    one all-to-all moves the largest matrix's size where one per stack moves every stack's."""
    width = max(s for s, c in zip(sizes, counts) if c and s)
    total = sum(counts)
    barrier = jax.lax.optimization_barrier

    def rows(blocks, dtype):
        parts = []
        for b, c, s in zip(blocks, counts, sizes):
            if b is None:
                parts.append(jnp.zeros((c, width), dtype))
            else:
                parts.append(jnp.pad(b.reshape(c, s).astype(dtype), ((0, 0), (0, width - s))))
        parts.append(jnp.zeros((devices - total, width), dtype))
        return jnp.concatenate(parts)

    def deal(blocks, dtype):
        return jax.lax.all_to_all(barrier(rows(blocks, dtype)), names, 0, 0, tiled=True)

    def back(received, shapes):
        y = jax.lax.all_to_all(barrier(received), names, 0, 0, tiled=True)
        offsets = np.cumsum([0, *counts])
        return [
            None if shape is None else y[a:b, :s].reshape(shape)
            for a, b, s, shape in zip(offsets[:-1], offsets[1:], sizes, shapes)
        ]

    return deal, back
