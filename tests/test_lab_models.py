"""The lab's models: initializers, losses and dtypes of ``lab.mlp_family`` / ``lab.MLP``."""

import jax
import jax.numpy as jnp
import numpy as np

import spectral_optax as so
from spectral_optax.lab import embed_init, loss_for


def test_standard_embed_init_has_std_one_over_sqrt_features():
    """embed_init('standard') draws a (vocab, features) table with std 1/sqrt(features)."""
    table = np.asarray(embed_init("standard")(jax.random.key(0), (512, 64), jnp.float32), np.float64)
    assert abs(table.std() / (1 / 8.0) - 1) < 0.05 and abs(table.mean()) < 0.01


def test_mse_loss_is_half_squared_difference():
    """loss_for('mse') = 0.5 (f - y)^2 per example, f reshaped to y."""
    f = jnp.array([[1.0], [2.0], [-1.0]])
    y = jnp.array([3.0, 2.0, 1.0])
    np.testing.assert_allclose(np.asarray(loss_for("mse")(f, y)), [2.0, 0.0, 2.0], rtol=0, atol=0)


def test_mlp_batch_gradient_keeps_float32_under_x64():
    """With x64 on, float32 inputs give float32 weights and a float32 gradient."""
    with jax.enable_x64(True):
        x = jnp.ones((3, 4), jnp.float32)
        g = so.diagnostics.mlp_batch_gradient(x, width=8, key=jax.random.key(0))
        assert g.dtype == jnp.float32 and g.shape == (8, 8)
