"""Dealing a stack to one whole matrix per device under ``shard_map``, and back: from a 2-D tiling
(:func:`tile_deal`) or from columns over every device (:func:`columns_deal`), one all-to-all each way
(docs/sharding.md)."""

from __future__ import annotations

import jax

from spectral_optax._mesh.layout import mesh_order

__all__ = ["columns_deal", "tile_deal"]


def columns_deal(names):
    """``(deal, back)`` under ``shard_map``: a stack of ``N`` matrices with its columns over the
    ``N`` devices in the order of ``names``
    (:func:`~spectral_optax._distributed.columns.stage_columns`) to one whole matrix per device
    (one all-to-all), and back."""
    # materialized first (optimization_barrier): XLA's CPU backend otherwise gives the all-to-all
    # operands of different layouts and fails its own verifier ("operands with different shapes")
    barrier = jax.lax.optimization_barrier
    deal = lambda block: jax.lax.all_to_all(barrier(block), names, 0, 2, tiled=True)
    back = lambda y, shape: jax.lax.all_to_all(barrier(y), names, 2, 0, tiled=True)
    return deal, back


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
