"""``scale_by_parametrization1``: muP / Parametrization-1 per-layer learning rates.

With the effective input width ``n_in`` (``d_in`` for matrices, 1 for
embeddings and vectors, whose inputs are one-hot or constant) the per-layer
learning-rate multiplier is

    SGD:          eta_l = eta * d_out / n_in        (spectral condition)
    Adam / sign:  eta_l = eta / n_in                (muP's Adam table)

so hidden layers of width n get ``eta`` (SGD) or ``eta / n`` (Adam), the
input layer ``eta * n`` (SGD) or ``eta`` (Adam), the read-out layer ``eta / n``
(both), biases ``eta * d_out`` (SGD) or ``eta`` (Adam).

With ``base`` (the parameters, or their shapes, of the model at the width
where the learning rate was tuned) each multiplier is divided by its value
at the base shape: the base model gets multiplier 1 everywhere, i.e. plain
SGD / Adam with the tuned learning rate, and wider models inherit it.

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning",
  Parametrization 1. Yang et al. (2021), "Tensor Programs V" (muP tables,
  base shapes). docs/math.md section 2.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from spectral_optax._geometry import (
    Geometry,
    GeometryError,
    GeometryLike,
    as_geometry_map,
    map_with_geometry,
)

P1_RULES = ("sgd", "adam")

#: The routes of :func:`~spectral_optax.route_lr_scale` (and of the named optimizers' routing tables).
ROUTES = ("hidden", "output", "embedding", "vector", "elementwise")


def route_of(geometry: Geometry) -> str:
    """A leaf's route: ``'hidden'`` / ``'output'`` matrices by role, else its kind.

    Args:
      geometry: the leaf's :class:`~spectral_optax.Geometry`.

    Returns:
      One of :data:`~spectral_optax.expert.ROUTES`.
    """
    if geometry.kind == "matrix":
        return "output" if geometry.role == "output" else "hidden"
    return geometry.kind


def lr_multiplier(geometry: Geometry, kind: str) -> float:
    """Parametrization-1 learning-rate multiplier of one parameter.

    ``d_out / n_in`` for ``kind='sgd'``, ``1 / n_in`` for ``kind='adam'``,
    with ``n_in = geometry.input_width`` (``d_in`` for a matrix, 1 for an
    embedding or a vector).

    Args:
      geometry: the parameter's :class:`~spectral_optax.Geometry`; ``d_out``
        is per fused block.
      kind: ``'sgd'`` (updates whose size follows the gradient's) or
        ``'adam'`` (Adam, sign descent: updates with Theta(1) entries).

    Returns:
      the multiplier, a Python float; absolute, i.e. not divided by a base
      model's (that is :func:`~spectral_optax.scale_by_parametrization1` with ``base``).
    """
    if kind == "sgd":
        return geometry.d_out / geometry.input_width
    if kind == "adam":
        return 1.0 / geometry.input_width
    raise ValueError(f"kind must be one of {P1_RULES}, got {kind!r}")


def base_multipliers(base: Any, kind: str, geometry: GeometryLike = None) -> dict[str, float]:
    """Multipliers of the base model by parameter path (``base``: params or shapes)."""
    return {p: lr_multiplier(g, kind) for p, g in as_geometry_map(geometry).leaves(base)}


def relative_multipliers(params: Any, kind: str, *, base: Any = None, geometry: GeometryLike = None):
    """``{path: multiplier}`` for every leaf of ``params`` (relative to ``base`` when given)."""
    gmap = as_geometry_map(geometry)
    at_base = base_multipliers(base, kind, gmap) if base is not None else None
    return {
        path: lr_multiplier(g, kind) / (_lookup_base(at_base, path) if at_base is not None else 1.0)
        for path, g in gmap.leaves(params)
    }


def _lookup_base(at_base: dict[str, float], path: str) -> float:
    if path not in at_base:
        raise GeometryError(
            f"parameter '{path}' is missing from `base`: pass the base model's params (same tree "
            "at the base width), e.g. base=model_at_base_width.init(key, x)['params']"
        )
    return at_base[path]


def scale_by_parametrization1(
    kind: str = "sgd",
    *,
    base: Any = None,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Multiply each update by its Parametrization-1 learning-rate multiplier.

    ``u_l <- (d_out / n_in) u_l`` (SGD) or ``u_l <- u_l / n_in`` (Adam), each
    divided by the same quantity at ``base`` when given. Stateless.

    Args:
      kind: ``'sgd'`` or ``'adam'`` (Adam, sign descent, Lion: any update with
        entries of size Theta(1)).
      base: params (or ``jax.ShapeDtypeStruct`` tree) of the model at the base
        width; multipliers become 1 there. ``None``: absolute multipliers.
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; updates keep their dtype.

    References:
      Yang, Simon, Bernstein (2023), Parametrization 1; Yang et al. (2021), muP.
    """
    if kind not in P1_RULES:
        raise ValueError(f"kind must be one of {P1_RULES}, got {kind!r}")
    gmap = as_geometry_map(geometry)
    at_base = base_multipliers(base, kind, gmap) if base is not None else None

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args

        def leaf(path: str, g: Geometry, u):
            m = lr_multiplier(g, kind)
            if at_base is not None:
                m = m / _lookup_base(at_base, path)
            return u * jnp.asarray(m, u.dtype)

        return map_with_geometry(leaf, gmap, updates, with_path=True, skip_empty=True), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)


def route_lr_scale(
    *,
    hidden: float = 1.0,
    output: float = 1.0,
    embedding: float = 1.0,
    vector: float = 1.0,
    elementwise: float = 1.0,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Per-route learning-rate multipliers, placed after a complete optimizer.

    ``u_l <- c_r(l) u_l`` with ``r(l)`` the leaf's route (:func:`~spectral_optax.expert.route_of`):
    hidden or output (read-out) matrices by role, else the geometry's kind
    (``'embedding'``, ``'vector'``, ``'elementwise'``). The multipliers are
    width-independent hyperparameters, tuned at the base width and kept
    (muP's per-group multipliers), e.g. an embedding learning rate 16x the
    global one for ``mup_adamw`` on the byte-level main job
    (docs/lab_log.md, "Why the muP family trails SP AdamW at small
    width")::

        optax.chain(so.mup_adamw(lr, base=base), so.route_lr_scale(embedding=16.0))

    A multiplier scales the whole update of its route, decoupled weight decay
    included (a learning rate multiplies the decay too).

    Args:
      hidden: multiplier of hidden matrices (``kind='matrix'``, role ``'hidden'``).
      output: multiplier of read-out matrices (role ``'output'``).
      embedding: multiplier of embedding tables.
      vector: multiplier of biases and norm scales.
      elementwise: multiplier of leaves no geometry rule decides.
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` with an empty state;
      updates keep their dtype.

    Raises:
      ValueError: a multiplier that is negative or not finite.
      GeometryError: at ``init``, a multiplier other than 1 for a route no
        parameter has (it would silently do nothing).
    """
    factors = {"hidden": hidden, "output": output, "embedding": embedding, "vector": vector, "elementwise": elementwise}
    for name, c in factors.items():
        if isinstance(c, int | float) and not (math.isfinite(c) and c >= 0):
            raise ValueError(f"route_lr_scale: {name}={c!r} must be a finite number >= 0 (1 leaves the route as is)")
    gmap = as_geometry_map(geometry)

    def init_fn(params):
        if jax.tree_util.tree_leaves(params):  # not optax.tree_map_params' empty placeholder
            seen: dict[str, list[str]] = {r: [] for r in ROUTES}
            map_with_geometry(
                lambda path, g, x: seen[route_of(g)].append(path), gmap, params, with_path=True, skip_empty=True
            )
            missing = [r for r, c in factors.items() if _concrete(c) not in (None, 1.0) and not seen[r]]
            if missing:
                have = ", ".join(f"{r} ({len(p)}: {p[0]}{', ...' if len(p) > 1 else ''})" for r, p in seen.items() if p)
                raise GeometryError(
                    f"route_lr_scale: no parameter has route {missing}, so its multiplier would do nothing. The "
                    f"routes present: {have}. Check the geometry (spectral_optax.describe(params)), or give "
                    "the multiplier to a route the model has."
                )
        return optax.EmptyState()

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args

        def leaf(g: Geometry, u):
            c = factors[route_of(g)]
            if _concrete(c) == 1.0:
                return u
            return (u * jnp.asarray(c, u.dtype)).astype(u.dtype)

        return map_with_geometry(leaf, gmap, updates, skip_empty=True), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _concrete(c) -> float | None:
    """``c`` as a float, or ``None`` when traced (``inject_hyperparams`` under ``jit``)."""
    try:
        return float(c)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None
