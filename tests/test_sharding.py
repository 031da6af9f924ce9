"""Optimizers under jit with NamedSharding (4 host CPU devices, in a subprocess).

Sharded and unsharded updates must agree: the norms inside the dual maps are
global reductions, which XLA turns into collectives.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import spectral_optax as so

    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    params = {
        "Embed_0": {"embedding": jnp.ones((32, 64))},
        "Dense_0": {"kernel": jnp.ones((64, 128)), "bias": jnp.zeros((128,))},
        "Dense_1": {"kernel": jnp.ones((128, 64))},
        "head": {"kernel": jnp.ones((64, 16))},
    }
    specs = {
        "Embed_0": {"embedding": P(None, "model")},
        "Dense_0": {"kernel": P("data", "model"), "bias": P("model")},
        "Dense_1": {"kernel": P("model", "data")},
        "head": {"kernel": P("data", None)},
    }
    keys = iter(jax.random.split(jax.random.key(0), 16))
    grads = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), params)
    shard = lambda tree: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)
    names = ["spectral_sgd", "mup_sgd", "mup_adamw", "muon", "moga"]
    for name in names:
        if not hasattr(so, name):
            continue
        tx = getattr(so, name)(0.1)
        ref, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        p_sh, g_sh = shard(params), shard(grads)
        out, _ = jax.jit(tx.update)(g_sh, jax.jit(tx.init)(p_sh), p_sh)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-6)
        assert out["Dense_0"]["kernel"].sharding.spec == P("data", "model"), (name, out["Dense_0"]["kernel"].sharding)
        print("ok", name)
    """
)


@pytest.mark.slow
def test_named_sharding_matches_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok spectral_sgd" in res.stdout and "ok mup_adamw" in res.stdout
