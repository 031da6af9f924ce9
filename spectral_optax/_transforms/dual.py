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
from spectral_optax._sharding import AxisName, gathered, keeping_specs


def dual_map_transform(
    dual: Callable[[jax.Array], jax.Array], geometry: GeometryLike = None, axis_name: AxisName = None
) -> optax.GradientTransformationExtraArgs:
    """A stateless ``GradientTransformation`` applying ``dual`` per leaf on the canonical view.

    ``axis_name`` (inside ``shard_map`` / ``pmap``): see ``spectral_optax._sharding.gathered``."""
    gmap = as_geometry_map(geometry)

    def leaf(g, u):  # on Explicit meshes under auto_axes: fused-block reshapes of sharded axes
        return keeping_specs(lambda x: (from_matrix(dual(to_matrix(x, g)), g),), [u])[0]

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        return map_with_geometry(leaf, gmap, updates, skip_empty=True), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), gathered(update_fn, axis_name))
