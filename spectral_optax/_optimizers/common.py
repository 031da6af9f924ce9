"""What every named optimizer is made of: a table of routes chosen by geometry.

A named optimizer is ``optax.partition(table, labels)`` (+ the shared decay
-> learning-rate tail of :mod:`spectral_optax._transforms.weight_decay`),
where ``table`` maps a route name to a transform built from the public
transforms and ``labels`` gives each parameter a route from its
:class:`~spectral_optax.Geometry` (kind and role), resolved once per tree
by the optimizer's single :class:`~spectral_optax.GeometryMap`.

The table is fixed at construction, so the optimizer state's structure
depends on the parameter tree only, never on which routes it happens to use:
``optax.tree_map_params`` and checkpoint restore see the same structure for
every model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax

from spectral_optax._geometry import Geometry, GeometryMap, label_by_geometry

__all__ = ["geometry_partition"]


def geometry_partition(
    table: Mapping[str, optax.GradientTransformation],
    route_of: Callable[[str, Geometry], str],
    gmap: GeometryMap,
    *,
    split: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """``optax.partition(table, labels)`` with labels from each leaf's geometry.

    Args:
      table: route name -> transform (fixed at construction).
      route_of: ``(path, geometry) -> route name``.
      gmap: the optimizer's geometry map (shared with the transforms in
        ``table``, so each tree is resolved once).
      split: optional ``params -> tree of bools``; a leaf whose value is
        False gets the route ``name + ':nodecay'`` (which must be in
        ``table``).
    """
    base = label_by_geometry(route_of, gmap)

    def labels(params):
        routes = base(params)
        if split is None or not jax.tree.leaves(params):  # an empty tree: tree_map_params' placeholder
            return routes
        keep = split(params)
        return jax.tree.map(lambda r, k: r if k else r + ":nodecay", routes, keep)

    return optax.partition(dict(table), labels)
