"""Decoupled weight decay: the tail every named optimizer shares, and the post-hoc form.

    u <- -lr_t * (u + weight_decay * mask * W)

The decay is multiplied by the global learning rate only (not by any width
or depth multiplier applied before it), and by default spares vectors
(biases, norm scales, also when stacked by ``nn.scan``), as decided by the
geometry rather than by ``ndim``.

References:
  Loshchilov & Hutter (2019), "Decoupled Weight Decay Regularization".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from spectral_optax._geometry import GeometryLike, label_by_geometry
from spectral_optax._numerics import static_value

__all__ = [
    "DecoupledWeightDecayState",
    "decay_mask_sparing_vectors",
    "decay_then_learning_rate",
    "decoupled_weight_decay",
    "is_literal_zero",
]


def is_literal_zero(x) -> bool:
    """True for a concrete 0 (a Python or NumPy number): such a transform can be skipped.

    A value injected by ``optax.inject_hyperparams`` is a traced array and is
    never skipped, so a chain's structure never depends on a traced value.
    """
    return isinstance(x, (int, float)) and static_value(x) == 0.0


def decay_mask_sparing_vectors(geometry: GeometryLike = None) -> Callable[[Any], Any]:
    """Weight-decay mask: ``True`` for matrices and embeddings, ``False`` for vectors."""
    return label_by_geometry(lambda _path, g: g.kind != "vector", geometry)


def decay_then_learning_rate(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: Any,
    weight_decay_mask: Any = None,
    geometry: GeometryLike = None,
) -> list[optax.GradientTransformation]:
    """``[add_decayed_weights(weight_decay, mask), scale_by_learning_rate(lr)]``.

    ``weight_decay_mask=None`` uses :func:`decay_mask_sparing_vectors`;
    ``True`` decays every leaf the tail sees (a route already chosen to decay).
    The decay step is always there, so the state's structure is the same
    whether ``weight_decay`` is a literal or a value injected by
    ``optax.inject_hyperparams`` (which traces every numeric argument): a
    checkpoint of one restores into the other. A literal 0 makes the step an
    identity (no work), with the same state.
    """
    mask = decay_mask_sparing_vectors(geometry) if weight_decay_mask is None else weight_decay_mask
    mask = None if mask is True else mask
    decay = optax.add_decayed_weights(weight_decay, mask)
    if is_literal_zero(weight_decay):
        decay = optax.GradientTransformation(decay.init, lambda updates, state, params=None: (updates, state))
    return [decay, optax.scale_by_learning_rate(learning_rate)]


class DecoupledWeightDecayState(NamedTuple):
    """Step count (for a learning-rate schedule)."""

    count: jax.Array  # type: ignore[assignment]  # optax's field name; shadows tuple.count


def decoupled_weight_decay(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float,
    *,
    mask: Any = None,
    geometry: GeometryLike = None,
) -> optax.GradientTransformationExtraArgs:
    """Add ``-learning_rate * weight_decay * W`` to finished updates.

    For chaining *after* a complete optimizer (whose output already includes
    ``-learning_rate``) and after :func:`~spectral_optax.depth_residual_scale`, so that the
    decay is not multiplied by ``alpha``: the result per leaf is
    ``-lr_t * (c * D(G) + weight_decay * W)``, exactly what the explicit-form
    optimizer with ``weight_decay`` does. Equivalent to
    ``add_decayed_weights(weight_decay, mask)`` followed by ``-learning_rate`` in the
    optimizer's own chain.

    Args:
      learning_rate: the optimizer's learning rate (float or optax schedule,
        evaluated at the same step count as the optimizer's).
      weight_decay: decoupled decay coefficient ``lambda``.
      mask: ``None`` (default): the named optimizers' own default, decided by
        the geometry: matrices and embeddings decay, leaves of kind
        ``'vector'`` (biases, norm scales, also stacked by ``nn.scan``, so
        not a rule on ``ndim``) do not; ``True``: every leaf; or an optax
        mask (tree of bools or ``params -> tree``).
      geometry: geometry overrides for the default mask (pass the
        optimizer's), see :func:`spectral_optax.as_geometry_map`.

    References:
      Loshchilov, Hutter (2019), decoupled weight decay.
    """
    if mask is None:
        mask = decay_mask_sparing_vectors(geometry)
    elif mask is True:
        mask = None

    def init_fn(params):
        del params
        return DecoupledWeightDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError("decoupled_weight_decay needs params: call tx.update(grads, state, params).")
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        m = mask(params) if callable(mask) else mask

        def decay(u, w, keep=True):
            if u is None or not keep:
                return u
            step = jnp.asarray(lr, jnp.float32) * jnp.asarray(weight_decay, jnp.float32)
            return (u.astype(jnp.float32) - step * w.astype(jnp.float32)).astype(u.dtype)

        if m is None:
            new = jax.tree_util.tree_map(decay, updates, params)
        else:
            new = jax.tree_util.tree_map(decay, updates, params, m)
        return new, DecoupledWeightDecayState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
