"""Parameter geometry: the single source of truth for what each parameter is.

Every axis of a weight is fan-in, fan-out or batch; each batch slice is one
``(d_in, d_out)`` matrix, and every rule of the package works on that
canonical view. The modules, each importing only those above it:

* :mod:`~spectral_optax._geometry.types`: :class:`Geometry`, the canonical view
  ``to_matrix`` / ``from_matrix``, leaf paths;
* :mod:`~spectral_optax._geometry.overrides`: ``{regex: override}`` parsing;
* :mod:`~spectral_optax._geometry.names`: the name rules;
* :mod:`~spectral_optax._geometry.views`, :mod:`~spectral_optax._geometry.walk` and
  :mod:`~spectral_optax._geometry.trace`: the geometry read off a traced forward pass (the views
  of a parameter that ops carry, the walk of the jaxpr, the decisions);
* :mod:`~spectral_optax._geometry.flax_hints`: Flax module hints, Linen / NNX glue;
* :mod:`~spectral_optax._geometry.resolve`: :class:`GeometryMap`, which decides
  every leaf once;
* :mod:`~spectral_optax._geometry.tree`: maps and labels over a parameter tree.

This package re-exports what the rest of ``spectral_optax`` imports from it.
"""

from spectral_optax._geometry.resolve import (
    GeometryLike,
    GeometryMap,
    as_geometry_map,
    infer_geometry,
    init_with_geometry,
)
from spectral_optax._geometry.tree import label_by_geometry, label_by_path, map_with_geometry
from spectral_optax._geometry.types import (
    KINDS,
    Geometry,
    GeometryError,
    GeometryWarning,
    from_matrix,
    path_str,
    to_matrix,
)

__all__ = [
    "KINDS",
    "Geometry",
    "GeometryError",
    "GeometryLike",
    "GeometryMap",
    "GeometryWarning",
    "as_geometry_map",
    "from_matrix",
    "infer_geometry",
    "init_with_geometry",
    "label_by_geometry",
    "label_by_path",
    "map_with_geometry",
    "path_str",
    "to_matrix",
]
