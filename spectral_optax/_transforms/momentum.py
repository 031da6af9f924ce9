"""``ema_momentum``: the one momentum transform of ``muon`` and ``moga``.

    mu_t = momentum * mu_{t-1} + (1 - momentum) * g_t
    out  = momentum * mu_t + (1 - momentum) * g_t     (nesterov=True)
           mu_t                                        (nesterov=False)

No bias correction by default: every dual map placed after it is invariant
to the update's scale, so the correction would not change a step without
Nesterov (with Nesterov this is Muon's published form). With
``bias_correction=True`` (``optax.contrib.muon``'s form, ``t`` = step count
from 1)::

    out = momentum * mu_t / (1 - momentum^(t+1)) + (1 - momentum) * g_t / (1 - momentum^t)
          (nesterov=True)
    out = mu_t / (1 - momentum^t)                                       (nesterov=False)

The average is taken in float32 or wider whatever the storage dtype
(``mu_dtype``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["EmaMomentumState", "ema_momentum"]


class EmaMomentumState(NamedTuple):
    """``mu``: the exponential moving average of the gradients (a tree like the
    params); ``count``: the step count (an int32 scalar with
    ``bias_correction=True``, else ``None``, an empty subtree)."""

    mu: Any
    count: Any = None


def _wide(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def ema_momentum(
    momentum: float = 0.95, *, nesterov: bool = False, mu_dtype: Any = None, bias_correction: bool = False
) -> optax.GradientTransformationExtraArgs:
    """EMA momentum, optionally in Nesterov form; see the module docstring.

    Args:
      momentum: the EMA coefficient (a float, or an array injected by
        ``optax.inject_hyperparams``).
      nesterov: emit ``momentum * mu_t + (1 - momentum) * g_t`` instead of ``mu_t``.
      mu_dtype: storage dtype of ``mu`` (default: each parameter's dtype).
      bias_correction: divide by ``1 - momentum^t`` as ``optax.contrib.muon``
        does (see the module docstring; adds a step count to the state).

    Returns:
      An ``optax.GradientTransformationExtraArgs``; the output has the
      gradient's dtype.
    """
    mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)

    def init_fn(params):
        # zeros_like: the buffers take the parameters' shardings (Explicit meshes, concrete arrays)
        mu = jax.tree.map(lambda p: jnp.zeros_like(p, dtype=mu_dtype or p.dtype), params)
        return EmaMomentumState(mu, jnp.zeros([], jnp.int32) if bias_correction else None)

    def update_fn(updates, state, params=None, **extra_args):
        del params, extra_args
        wide_g = jax.tree.map(_wide, updates)
        mu = optax.tree.update_moment(wide_g, jax.tree.map(_wide, state.mu), momentum, 1)
        count = None
        if bias_correction:
            count = optax.safe_increment(state.count)
            out = debiased_momentum(mu, wide_g, momentum, count, nesterov)
        else:
            out = optax.tree.update_moment(wide_g, mu, momentum, 1) if nesterov else mu
        out = jax.tree.map(lambda o, g: o.astype(g.dtype), out, updates)
        mu = jax.tree.map(lambda m, old: m.astype(old.dtype), mu, state.mu)
        return out, EmaMomentumState(mu, count)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def debiased_momentum(mu, grads, momentum, count, nesterov: bool):
    """The step of a bias-corrected EMA ``mu`` (already updated with ``grads``) at step ``count`` (1-based), as
    ``optax.contrib.muon`` forms it: ``mu / (1 - momentum^t)``, or with Nesterov
    ``momentum mu / (1 - momentum^(t+1)) + (1 - momentum) g / (1 - momentum^t)``."""
    if not nesterov:
        return optax.tree.bias_correction(mu, momentum, count)
    return jax.tree.map(
        lambda m, g: momentum * m + (1 - momentum) * g,
        optax.tree.bias_correction(mu, momentum, optax.safe_increment(count)),
        optax.tree.bias_correction(grads, momentum, count),
    )
