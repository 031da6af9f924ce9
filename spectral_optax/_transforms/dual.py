"""The one mechanism of a stateless dual-map transform.

Every update leaf is read through its geometry as ``(num_slices, d_in,
d_out)``, mapped by a dual map on that canonical view, and written back:

    u <- from_matrix(dual(to_matrix(u, g)), g).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from spectral_optax._geometry import (
    GeometryLike,
    as_geometry_map,
    from_matrix,
    map_with_geometry,
    to_matrix,
)
from spectral_optax._mesh.layout import (
    AxisName,
    aval_mesh,
    blocks_local,
    distribution_axes,
    gathered,
    keeping_specs,
    manual_axes,
    mesh_size,
)


def on_canonical_view(fn: Callable, g, u, *extras):
    """``fn(to_matrix(u, g), *extras)`` ``-> (matrix, *new_extras)``, the matrix written back in
    ``u``'s shape: ``(leaf, *new_extras)``. On ``Explicit`` meshes under ``auto_axes``
    (:func:`~spectral_optax._mesh.layout.keeping_specs`: reshapes of sharded axes, the
    fused-block cut of a QKV leaf, are XLA's to partition), the leaf in ``u``'s
    ``PartitionSpec``; fused blocks are cut and joined where they are local
    (:func:`~spectral_optax._mesh.layout.blocks_local`). ``extras`` (small state, e.g. power
    iteration vectors) are replicated."""
    mesh = aval_mesh(u)
    n = mesh_size(mesh, distribution_axes(mesh)) if mesh is not None and not manual_axes(mesh) else 1

    def one(x, *rest):
        m, *new = fn(to_matrix(blocks_local(x, g, n), g), *rest)
        return (blocks_local(from_matrix(m, g), g, n), *new)

    return keeping_specs(one, [u, *extras], mesh)


def dual_map_transform(
    dual: Callable[[jax.Array], jax.Array], geometry: GeometryLike = None, axis_name: AxisName = None
) -> optax.GradientTransformationExtraArgs:
    """A stateless ``GradientTransformation`` applying ``dual`` per leaf on the canonical view.

    ``axis_name`` (inside ``shard_map`` / ``pmap``): see ``spectral_optax._mesh.layout.gathered``."""
    gmap = as_geometry_map(geometry)

    def leaf(g, u):
        return on_canonical_view(lambda m: (dual(m),), g, u)[0]

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        return map_with_geometry(leaf, gmap, updates, skip_empty=True), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), gathered(update_fn, axis_name))
