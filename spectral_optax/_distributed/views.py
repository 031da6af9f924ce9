"""Views of the devices for ``shard_map``: the leaves' devices reshaped into other axes
(:func:`group_view`), on the concrete mesh of ``jax.set_mesh`` where there is one
(:func:`concrete_mesh`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from spectral_optax._mesh.layout import device_view

__all__ = ["concrete_mesh", "group_view"]

GET_CONCRETE_MESH: Callable[[], Any] | None
try:  # no public accessor in JAX 0.10 (see concrete_mesh)
    from jax._src import mesh as _jax_mesh

    GET_CONCRETE_MESH = _jax_mesh.get_concrete_mesh
except (ImportError, AttributeError):  # pragma: no cover  (tests/test_distributed_mesh.py fails on the supported JAX)
    GET_CONCRETE_MESH = None


def group_view(mesh, shape: Sequence[int], names: Sequence[str] = ("_owners", "_split")):
    """The devices of ``mesh`` (in its order) viewed as a mesh of ``shape`` with axes ``names``
    (default an ``(owners, split)`` mesh, ``('_owners', '_split')``): ``(abstract mesh, mesh for
    shard_map)``. Under ``jax.set_mesh`` ``shard_map`` lowers on the concrete mesh, so the view is
    then a concrete ``Mesh`` of the same devices reshaped (``P(('_owners', '_split'))`` is
    ``P(axes)`` of the leaves' mesh; the owner axis major: docs/lab_log.md), led by a
    ``'_replica'`` axis within replica groups (:func:`~spectral_optax._mesh.layout.device_view`)."""
    del mesh  # the view is of the context's devices, in the leaves' mesh order
    abstract = device_view(tuple(shape), tuple(names))
    concrete = concrete_mesh()
    if concrete is not None and not concrete.empty and concrete.size == abstract.size:
        view = jax.sharding.Mesh(
            concrete.devices.reshape(abstract.axis_sizes), abstract.axis_names, axis_types=abstract.axis_types
        )
        return view.abstract_mesh, view
    return abstract, abstract


def concrete_mesh():
    """The mesh of ``jax.set_mesh`` while tracing (what ``shard_map`` lowers on), else ``None``.

    JAX 0.10 has no public accessor of it inside ``jit``: ``jax.sharding.get_mesh`` raises under a
    trace, and ``jax.sharding.get_abstract_mesh()`` and ``jax.typeof(x).sharding.mesh`` are abstract
    (no devices), while ``shard_map`` itself reads the concrete one there. So the private accessor is
    used (:data:`GET_CONCRETE_MESH`); on a JAX without it the abstract view is taken, and
    ``tests/test_distributed_mesh.py`` fails on the supported JAX if that happens.
    """
    return None if GET_CONCRETE_MESH is None else GET_CONCRETE_MESH()
