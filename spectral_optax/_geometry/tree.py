"""Tree helpers: maps and labels over a parameter tree, leaf by leaf with its :class:`Geometry`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from spectral_optax._geometry.resolve import GeometryLike, as_geometry_map
from spectral_optax._geometry.types import Geometry, path_str


def map_with_geometry(
    fn: Callable,
    geometry: GeometryLike,
    tree,
    *rest,
    num_outputs: int = 1,
    with_path: bool = False,
    skip_empty: bool = False,
):
    """``tree_map`` over ``tree`` (and same-structure ``rest``) calling
    ``fn(geometry, leaf, *rest_leaves)`` with each leaf's :class:`~spectral_optax.Geometry`.

    ``None`` leaves (and optax ``MaskedNode``s) pass through untouched. With
    ``num_outputs=n > 1``, ``fn`` returns an n-tuple and a tuple of n trees is
    returned (non-array leaves are copied into each). With ``with_path=True``
    ``fn(path, geometry, leaf, *rest_leaves)`` also gets the '/'-joined path.
    With ``skip_empty=True``, size-0 array leaves of ``tree`` are not handed
    to ``fn`` either: they pass through as they are (an empty update has no
    direction to normalize; the dual transforms use this).

    Args:
      fn: ``fn(geometry, leaf, *rest_leaves)`` (``fn(path, geometry, leaf,
        *rest_leaves)`` with ``with_path=True``).
      geometry: geometry overrides, see :func:`~spectral_optax.as_geometry_map`.
      tree: the tree whose leaves' geometries are resolved.
      rest: further trees of the same structure, passed leaf by leaf.
      num_outputs: the number of outputs of ``fn`` (trees returned).
      with_path: also pass each leaf's '/'-joined path.
      skip_empty: pass size-0 leaves through without calling ``fn``.
    """
    gmap = as_geometry_map(geometry)
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    rest_flat = [treedef.flatten_up_to(r) for r in rest]  # type: ignore[attr-defined]
    paths = [path_str(p) for p, _ in flat]
    shapes = [tuple(np.shape(x)) for _, x in flat]
    is_array = [hasattr(x, "shape") and not (skip_empty and math.prod(s) == 0) for (_, x), s in zip(flat, shapes)]
    geoms = gmap.resolve([p for p, a in zip(paths, is_array) if a], [s for s, a in zip(shapes, is_array) if a])
    it = iter(geoms)
    out = []
    for i, (_, x) in enumerate(flat):
        if is_array[i]:
            args = (paths[i],) if with_path else ()
            y = fn(*args, next(it), x, *(r[i] for r in rest_flat))
        else:
            y = (x,) * num_outputs if num_outputs > 1 else x
        out.append(y)
    if num_outputs == 1:
        return jax.tree_util.tree_unflatten(treedef, out)
    return tuple(jax.tree_util.tree_unflatten(treedef, [y[k] for y in out]) for k in range(num_outputs))


def label_by_geometry(label_fn: Callable[[str, Geometry], Any], geometry: GeometryLike = None) -> Callable[[Any], Any]:
    """A ``param_labels`` callable for ``optax.partition`` driven by geometry.

    Args:
      label_fn: ``(path, geometry) -> label`` for every array leaf.
      geometry: overrides; see :func:`~spectral_optax.as_geometry_map`.

    Returns:
      ``params -> tree of labels`` with the structure of ``params``.
    """
    gmap = as_geometry_map(geometry)

    def labels(params):
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        paths = [path_str(p) for p, _ in flat]
        geoms = gmap.resolve(paths, [tuple(np.shape(x)) for _, x in flat])
        return jax.tree_util.tree_unflatten(treedef, [label_fn(p, g) for p, g in zip(paths, geoms)])

    return labels


def label_by_path(label_fn: Callable[[str], Any], default: Any = False) -> Callable[[Any], Any]:
    """``params -> tree`` with ``label_fn(path)`` at every array leaf (``default`` elsewhere).

    For rules that depend on the '/'-joined path only (regex masks), so that
    no geometry needs to be decided.
    """

    def labels(params):
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        return jax.tree_util.tree_unflatten(
            treedef, [label_fn(path_str(p)) if hasattr(x, "shape") else default for p, x in flat]
        )

    return labels
