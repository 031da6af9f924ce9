"""Decoupled weight decay: the documented skip of a literal-zero decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("name", ["moga", "spectral_sgd", "mup_sgd", "mup_adamw", "rescaled_adamw"])
def test_literal_zero_weight_decay_needs_no_params(name):
    """A literal 0 weight decay adds no decay transform (documented), so, as ``optax.adam``,
    ``update`` works without ``params``; any other value needs them."""
    make = {"moga": so.moga, "spectral_sgd": so.spectral_sgd, "mup_sgd": so.mup_sgd, "mup_adamw": so.mup_adamw,
            "rescaled_adamw": so.rescaled_adamw}[name]
    rng = np.random.default_rng(0)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((4, 6)), "bias": rng.standard_normal(6)}})
    grads = f32({"Dense_0": {"kernel": rng.standard_normal((4, 6)), "bias": rng.standard_normal(6)}})
    tx = make(0.1, weight_decay=0.0)
    state = tx.init(params)
    without, _ = tx.update(grads, state, None)
    with_params, _ = tx.update(grads, state, params)
    jax.tree.map(np.testing.assert_array_equal, without, with_params)
    decayed = make(0.1, weight_decay=0.1)
    with pytest.raises(ValueError):
        decayed.update(grads, decayed.init(params), None)
