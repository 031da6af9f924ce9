"""Pieces of the float64 NumPy reference forwards shared by the model tests
(``test_nn``, ``test_gpt``, ``test_resnet``): written independently of the
package, never calling it."""

from __future__ import annotations

import jax
import numpy as np


def f64(x):
    """A float64 NumPy copy of an array."""
    return np.asarray(x, np.float64)


def layer_norm(x, p, eps=1e-6):
    """LayerNorm over the last axis with ``p['scale']``, ``p['bias']`` (Flax's default epsilon)."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * f64(p["scale"]) + f64(p["bias"])


def randomize(params, seed=3, scale=0.3):
    """Every leaf redrawn ``scale * N(0, 1)`` (nonzero biases and norms everywhere, so the reference
    sees every parameter)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
