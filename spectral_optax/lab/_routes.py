"""The update split by route, for drift diagnoses: which leaf is a hidden matrix, the read-out, an embedding
table or a vector, and the step along each part that the local quadratic model of the loss prefers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from spectral_optax import GeometryMap

#: The routes of :func:`route_labels`, in the order :func:`quadratic_steps` reports them (after ``'all'``).
ROUTES = ("hidden", "head", "embedding", "vector")


def route_labels(params: Any, geometry: GeometryMap | None = None) -> list[str]:
    """The route of every leaf of ``params``, in ``jax.tree_util.tree_leaves`` order, from its geometry.

    ``'embedding'`` (token and position tables), ``'head'`` (a matrix whose role is the read-out),
    ``'hidden'`` (every other matrix), ``'vector'`` (biases, norm scales, anything element-wise).

    Args:
      params: a parameter tree (arrays or ``jax.ShapeDtypeStruct``).
      geometry: the :class:`~spectral_optax.GeometryMap` that decides the leaves (``None``: a fresh one,
        the Flax names).

    Returns:
      one of :data:`ROUTES` per leaf.
    """
    leaves = (geometry or GeometryMap()).leaves(params)
    shapes = [tuple(x.shape) for x in jax.tree_util.tree_leaves(params)]
    if [g.shape for _, g in leaves] != shapes:
        raise ValueError("route_labels: geometry leaves are not in tree_leaves order")
    out = []
    for _, g in leaves:
        if g.kind == "embedding":
            out.append("embedding")
        elif g.kind == "matrix":
            out.append("head" if g.role == "output" else "hidden")
        else:
            out.append("vector")
    return out


def quadratic_steps(
    loss: Callable[[Any], jax.Array], params: Any, grads: Any, direction: Any, labels: Sequence[str]
) -> dict[str, dict[str, jax.Array]]:
    """The step along an update direction, whole and restricted to each route, that the quadratic model prefers.

    Along ``u_r`` (``direction`` with the leaves of other routes zeroed; ``'all'``: the whole ``u``): the
    first-order decrease ``d = -g . u_r``, the curvature ``c = u_r^T H u_r`` (a Hessian-vector product,
    forward over reverse) and ``eta* = d / c``, the minimizer of ``L(theta + eta u_r) ~ L - eta d + eta^2 c / 2``.
    A route with no leaf has ``d = c = 0`` (``eta*`` NaN).

    Args:
      loss: ``params -> scalar``.
      params: where the model is expanded.
      grads: ``grad(loss)(params)``.
      direction: the update (a descent direction: ``d > 0``), shaped like ``params``.
      labels: the route of each leaf in ``tree_leaves`` order (:func:`route_labels`).

    Returns:
      ``{route: {'decrease': d, 'curvature': c, 'eta_star': d / c}}`` for ``'all'`` and each of :data:`ROUTES`.
    """
    treedef = jax.tree_util.tree_structure(params)

    def restrict(route):
        leaves = jax.tree_util.tree_leaves(direction)
        kept = [u if route is None or lab_ == route else jnp.zeros_like(u) for lab_, u in zip(labels, leaves)]
        return jax.tree_util.tree_unflatten(treedef, kept)

    def dot(a, b):
        return sum(jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

    out = {}
    for route in (None, *ROUTES):
        u = restrict(route)
        hu = jax.jvp(jax.grad(loss), (params,), (u,))[1]
        d, c = -dot(grads, u), dot(u, hu)
        out[route or "all"] = {"decrease": d, "curvature": c, "eta_star": d / c}
    return out
