"""``scale_by_spectral_norm``: updates with the spectral condition's size.

Every matrix update (per batch slice of the canonical view) is rescaled to
spectral norm ``sqrt(d_out / d_in)``:

    U = sqrt(d_out / d_in) * G / ||G||_*,

with ``||G||_*`` replaced by ``||G||_F`` (``method='frobenius'``, default:
cheap, exact for rank-1 gradients, and within a factor ``sqrt(stable rank)``
otherwise) or estimated by warm-started power iteration
(``method='power'``). Embeddings (one-hot input, l1 -> RMS): every token's
fan-out vector is scaled to RMS 1. Vectors (biases, norm scales; a matrix
fed by a constant input of width 1): the vector is scaled to RMS 1, which is
spectral norm ``sqrt(d_out / 1)``.

References:
  Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning",
  Condition 1 and section 3. The math: docs/math.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from spectral_optax._duals.embedding import normalize_fan_out_rms
from spectral_optax._duals.spectral import frobenius_normalize, spectral_normalize_power
from spectral_optax._geometry import (
    Geometry,
    GeometryLike,
    as_geometry_map,
    map_with_geometry,
)
from spectral_optax._mesh.layout import AxisName, gathered, replicated_on_mesh_of
from spectral_optax._transforms.dual import dual_map_transform, on_canonical_view

METHODS = ("frobenius", "power")


def scale_by_fan_out_rms(
    *, geometry: GeometryLike = None, axis_name: AxisName = None
) -> optax.GradientTransformationExtraArgs:
    """Every fan-in index's fan-out vector scaled to RMS 1 (the l1 -> RMS dual).

    The steepest-descent direction of an embedding table (one-hot inputs);
    for a vector (``d_in = 1``) the whole vector is scaled to RMS 1. This is
    :func:`~spectral_optax.scale_by_spectral_norm`'s rule for embeddings and vectors, and
    ``muon``'s ``'normalize'`` route. Stateless; all-zero vectors stay zero.

    Args:
      geometry: anything :func:`spectral_optax.as_geometry_map` accepts
        (``None`` infers from Flax names).
      axis_name: inside ``shard_map`` / ``pmap``, how the update blocks are
        sharded (see :func:`~spectral_optax.orthogonalize_via_newton_schulz`).

    Returns:
      A stateless ``optax.GradientTransformationExtraArgs``; dtypes are
      preserved.
    """
    return dual_map_transform(normalize_fan_out_rms, geometry, axis_name)


class ScaleBySpectralNormState(NamedTuple):
    """``count``: updates so far. ``right_vectors``: warm-start right singular
    vectors of every matrix leaf (``(num_slices, d_out)`` each, in the order
    of the parameter leaves), flattened and concatenated into one float32
    vector (``method='power'``; empty otherwise). One array, not a
    params-shaped tree, so ``optax.tree_map_params`` (which maps the leaves
    shaped like the params) never hands them to its function."""

    count: jax.Array  # type: ignore[assignment]  # optax's field name; shadows tuple.count
    right_vectors: jax.Array


def scale_by_spectral_norm(
    *,
    method: str = "frobenius",
    power_iterations: int = 2,
    initial_power_iterations: int = 20,
    geometry: GeometryLike = None,
    axis_name: AxisName = None,
) -> optax.GradientTransformationExtraArgs:
    """Rescale each update to the spectral condition's norm, per batch slice.

    Matrices: ``sqrt(d_out / d_in) * G / ||G||_*``; embeddings: each token's
    fan-out vector to RMS 1; vectors: RMS 1. Zero gradients give zero updates.

    Args:
      method: ``'frobenius'`` (``||G||_*`` replaced by ``||G||_F``) or
        ``'power'`` (warm-started power iteration; vectors kept in the state).
      power_iterations: power-iteration steps per update (``method='power'``).
      initial_power_iterations: steps at the first update, from random vectors.
      geometry: geometry overrides, see :func:`spectral_optax.as_geometry_map`.
      axis_name: inside ``shard_map`` / ``pmap``, how the update blocks are
        sharded (see :func:`~spectral_optax.orthogonalize_via_newton_schulz`); ``'frobenius'`` only.

    Returns:
      An ``optax.GradientTransformation``.

    References:
      Yang, Simon, Bernstein (2023), "A Spectral Condition for Feature Learning".
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if axis_name is not None and method != "frobenius":
        raise ValueError("scale_by_spectral_norm: axis_name (shard_map) works with method='frobenius' only")
    geometry = as_geometry_map(geometry)  # resolved once per tree, shared by init and update
    for name, value in (("power_iterations", power_iterations), ("initial_power_iterations", initial_power_iterations)):
        # Values injected by optax.inject_hyperparams arrive as tracers: they
        # are only checked when concrete.
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")

    def init_fn(params):
        count = jnp.zeros([], jnp.int32)
        vectors = [jnp.zeros((0,), jnp.float32)]
        if method == "power":
            flat = jax.tree_util.tree_leaves(
                map_with_geometry(lambda g, x: g, geometry, params, skip_empty=True),
                is_leaf=lambda x: isinstance(x, Geometry),
            )
            for g in flat:
                if isinstance(g, Geometry) and g.kind == "matrix":
                    key = jax.random.fold_in(jax.random.key(0), len(vectors) - 1)
                    vectors.append(jax.random.normal(key, (g.num_slices * g.d_out,), jnp.float32))
        return ScaleBySpectralNormState(count, replicated_on_mesh_of(jnp.concatenate(vectors), params))

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        iterations = jnp.where(state.count == 0, initial_power_iterations, power_iterations)
        offset = 0
        new_vectors = [jnp.zeros((0,), jnp.float32)]

        def leaf(g: Geometry, u):
            target = lambda d: d * jnp.asarray(g.target_spectral_norm, d.dtype)
            if g.kind != "matrix":
                return on_canonical_view(lambda m: (normalize_fan_out_rms(m),), g, u)[0]
            if method == "frobenius":
                return on_canonical_view(lambda m: (target(frobenius_normalize(m)),), g, u)[0]
            nonlocal offset
            size = g.num_slices * g.d_out
            v = state.right_vectors[offset : offset + size].reshape(g.num_slices, g.d_out)
            offset += size

            def power(m, v, steps):  # (steps an argument: typed on the view's mesh, as v)
                d, v = spectral_normalize_power(m, v, steps)
                return target(d), v, steps

            d, v, _ = on_canonical_view(power, g, u, v, iterations)
            new_vectors.append(v.reshape(-1).astype(jnp.float32))
            return d

        new_updates = map_with_geometry(leaf, geometry, updates, skip_empty=True)
        count = optax.safe_increment(state.count)
        return new_updates, ScaleBySpectralNormState(count, jnp.concatenate(new_vectors))

    return optax.GradientTransformationExtraArgs(init_fn, gathered(update_fn, axis_name))
