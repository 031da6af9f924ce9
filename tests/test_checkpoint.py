"""Optimizer states survive a save/restore round trip bit for bit, and training
resumed from the restored state continues exactly as the uninterrupted run."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

import spectral_optax as so

OPTIMIZERS = {
    "spectral_sgd": lambda: so.spectral_sgd(0.1, method="power"),
    "mup_sgd": lambda: so.mup_sgd(0.1, momentum=0.9),
    "mup_adamw": lambda: so.mup_adamw(1e-3),
    "muon": lambda: so.muon(0.02),
    "moga": lambda: so.moga(0.01),
    "inject(spectral_sgd)": lambda: optax.inject_hyperparams(so.spectral_sgd)(learning_rate=0.1),
}


def params0():
    k = iter(jax.random.split(jax.random.key(0), 8))
    return {
        "Embed_0": {"embedding": jax.random.normal(next(k), (20, 16))},
        "Dense_0": {"kernel": jax.random.normal(next(k), (16, 32)) * 0.2, "bias": jnp.zeros((32,))},
        "head": {"kernel": jax.random.normal(next(k), (32, 4)) * 0.1},
    }


def grads_at(params, step):
    key = jax.random.fold_in(jax.random.key(1), step)
    return jax.tree.map(lambda x: jax.random.normal(key, x.shape) + 0.1 * x, params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_roundtrip_and_resume(name):
    factory = OPTIMIZERS[name]
    if name in ("muon", "moga") and not hasattr(so, name):
        pytest.skip(f"{name} not available")
    tx = factory()
    update = jax.jit(tx.update)
    params, state = params0(), tx.init(params0())
    for step in range(3):
        u, state = update(grads_at(params, step), state, params)
        params = optax.apply_updates(params, u)
    blob = serialization.to_bytes((params, state))
    # Restore into a fresh template (what a user does after a restart).
    template = (params0(), factory().init(params0()))
    restored_params, restored_state = serialization.from_bytes(template, blob)
    for a, b in zip(jax.tree.leaves((params, state)), jax.tree.leaves((restored_params, restored_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.dtype == b.dtype
    # Continue both runs two more steps: identical.
    p1, s1, p2, s2 = params, state, restored_params, restored_state
    for step in range(3, 5):
        u1, s1 = update(grads_at(p1, step), s1, p1)
        p1 = optax.apply_updates(p1, u1)
        u2, s2 = update(grads_at(p2, step), s2, p2)
        p2 = optax.apply_updates(p2, u2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
