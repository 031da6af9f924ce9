"""``so.contrib_muon`` against the installed ``optax.contrib.muon``: the AdamW route's ``eps`` and ``eps_root``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so


def _three_steps(tx, params):
    """``params`` after three updates of ``tx`` on fixed N(0, 1) gradients (seeds 0, 1, 2)."""
    p, s = params, tx.init(params)
    for i in range(3):
        g = jax.tree.map(lambda x, i=i: jnp.asarray(np.random.default_rng(i).standard_normal(x.shape), jnp.float32),
                         params)
        u, s = tx.update(g, s, p)
        p = optax.apply_updates(p, u)
    return p


@pytest.mark.usefixtures("highest_precision")
def test_contrib_muon_adam_eps_root_matches_optax_contrib():
    rng = np.random.default_rng(9)
    params = {"a": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
              "c": jnp.asarray(rng.standard_normal((5,)), jnp.float32)}
    kw = {"adam_eps_root": 1e-2}
    outs = [_three_steps(tx, params) for tx in (optax.contrib.muon(0.05, **kw), so.contrib_muon(0.05, **kw))]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outs[1], outs[0])
    p = _three_steps(so.contrib_muon(0.05), params)  # eps_root matters on this tree
    assert not np.allclose(p["c"], outs[0]["c"], rtol=1e-6)


@pytest.mark.usefixtures("highest_precision")
def test_contrib_muon_eps_reaches_the_adamw_route():
    """``eps`` is also AdamW's epsilon (as in contrib): with a large one the non-matrix leaves
    match ``optax.contrib.muon`` and differ from the default (contrib also adds ``eps`` to the
    Frobenius norm before Newton-Schulz, which this does not, so matrices are not compared)."""
    rng = np.random.default_rng(13)
    params = {"a": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
              "c": jnp.asarray(rng.standard_normal((5,)), jnp.float32),
              "d": jnp.asarray(rng.standard_normal((2, 3, 2)), jnp.float32)}
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), params)
             for _ in range(3)]

    def trajectory(tx):
        p, s = params, tx.init(params)
        for g in grads:
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        return p

    want = trajectory(optax.contrib.muon(0.05, eps=0.3))
    got = trajectory(so.contrib_muon(0.05, eps=0.3))
    default = trajectory(so.contrib_muon(0.05))
    for k in ("c", "d"):
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(default[k]), np.asarray(want[k]), rtol=1e-4)
