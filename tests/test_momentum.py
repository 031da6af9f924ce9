"""``so.ema_momentum`` and the momentum of every route: ``mu_dtype``, bias correction over steps (float64 NumPy)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("nesterov", [False, True])
def test_ema_momentum_stores_mu_in_mu_dtype(nesterov):
    """``mu_dtype=bfloat16``: the state is bf16, rounded after every step; the output keeps
    the gradient's float32 dtype (float64 reference with the same rounding)."""
    rng = np.random.default_rng(3)
    gs = [rng.standard_normal((5, 4)) for _ in range(3)]
    beta = 0.8
    tx = so.ema_momentum(beta, nesterov=nesterov, mu_dtype=jnp.bfloat16)
    state = tx.init({"w": jnp.zeros((5, 4), jnp.float32)})
    assert state.mu["w"].dtype == jnp.bfloat16
    mu = np.zeros((5, 4))
    for g in gs:
        out, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        g32 = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        new = beta * mu + (1 - beta) * g32
        want = beta * new + (1 - beta) * g32 if nesterov else new
        mu = np.asarray(jnp.asarray(new, jnp.bfloat16), np.float64)
        assert state.mu["w"].dtype == jnp.bfloat16 and out["w"].dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(state.mu["w"], np.float64), mu, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out["w"]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("name", ["muon", "contrib_muon", "moga", "rescaled_adamw"])
def test_mu_dtype_reaches_every_route(name):
    """``mu_dtype``: every EMA momentum and every Adam first moment, on every route, is stored
    in it (Adam's second moment stays float32, as in ``optax.adamw``)."""
    make = {"muon": lambda: so.muon(0.1, mu_dtype=jnp.bfloat16),
            "contrib_muon": lambda: so.contrib_muon(0.1, mu_dtype=jnp.bfloat16),
            "moga": lambda: so.moga(0.1, mu_dtype=jnp.bfloat16, rules={r"bias$": "adam"}),
            "rescaled_adamw": lambda: so.rescaled_adamw(0.1, mu_dtype=jnp.bfloat16)}[name]
    params = f32({"Dense_0": {"kernel": np.ones((4, 6)), "bias": np.ones(6)}})
    state = make().init(params)
    kinds = (so.expert.EmaMomentumState, optax.ScaleByAdamState, optax.contrib.MuonState)
    nodes = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kinds)) if isinstance(s, kinds)]
    mus = [x for s in nodes for x in jax.tree.leaves(s.mu) if x.shape in ((4, 6), (6,))]
    nus = [x for s in nodes if isinstance(s, optax.ScaleByAdamState) for x in jax.tree.leaves(s.nu)
           if x.shape in ((4, 6), (6,))]
    assert len(mus) >= 2 and nus
    assert all(x.dtype == jnp.bfloat16 for x in mus), [x.dtype for x in mus]
    assert all(x.dtype == jnp.float32 for x in nus)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("nesterov", [False, True])
def test_ema_momentum_bias_correction_over_steps(nesterov):
    """``bias_correction=True`` (``optax.contrib.muon``'s form), float64 reference over 4 steps:
    ``mu_t / (1 - b^t)``, or with Nesterov ``b mu_t / (1 - b^(t+1)) + (1 - b) g_t / (1 - b^t)``."""
    rng = np.random.default_rng(4)
    beta = 0.7
    tx = so.ema_momentum(beta, nesterov=nesterov, bias_correction=True)
    state = tx.init({"w": jnp.zeros((3, 4), jnp.float32)})
    mu = np.zeros((3, 4))
    for t in range(1, 5):
        g = rng.standard_normal((3, 4))
        out, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        mu = beta * mu + (1 - beta) * g
        if nesterov:
            want = beta * mu / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)
        else:
            want = mu / (1 - beta**t)
        assert int(state.count) == t
        np.testing.assert_allclose(np.asarray(out["w"]), want, rtol=1e-5, atol=1e-6)
