"""``so.scale_by_neuron_second_moment``: dtypes of its updates."""

import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so


@pytest.mark.usefixtures("highest_precision")
def test_neuron_second_moment_keeps_bfloat16_updates():
    """scale_by_neuron_second_moment returns updates in the updates' dtype (bfloat16 stays bfloat16)."""
    g = {"Dense_0": {"kernel": jnp.asarray(np.eye(4, 6), jnp.bfloat16)}}
    tx = so.scale_by_neuron_second_moment()
    out, _ = tx.update(g, tx.init(g))
    assert out["Dense_0"]["kernel"].dtype == jnp.bfloat16
