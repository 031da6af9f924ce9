"""``so.orthogonalize_via_newton_schulz``: same-shape matrices, batched through the iteration together, come back
each in its own place."""

import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so


@pytest.mark.usefixtures("highest_precision")
def test_same_shape_matrices_come_back_in_their_own_places():
    """Five leaves, three of one shape (one call of the iteration for them) and two of others: each update is
    its own gradient's polar factor (``so.newton_schulz`` of that leaf alone) times one scalar, never another
    leaf's."""
    rng = np.random.default_rng(14)
    shapes = {"a": (3, 5), "b": (4, 4), "c": (3, 5), "d": (5, 3), "e": (3, 5)}
    grads = {k: {"kernel": jnp.asarray(rng.standard_normal(s), jnp.float32)} for k, s in shapes.items()}
    tx = so.orthogonalize_via_newton_schulz()
    updates, _ = tx.update(grads, tx.init(grads))
    for k in shapes:
        u = np.asarray(updates[k]["kernel"], np.float64)
        alone = np.asarray(so.newton_schulz(grads[k]["kernel"]), np.float64)
        ratio = u / alone
        np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-4, err_msg=k)
