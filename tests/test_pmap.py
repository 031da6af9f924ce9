"""Data-parallel training with ``jax.pmap`` (legacy, but named in the design brief):
replicated parameters and states, per-device batches, ``lax.pmean`` of the gradients;
5 steps equal the single-device run on the whole batch."""

from tests.test_sharding import run_script

SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, optax
import spectral_optax as so

n = jax.device_count()
assert n == 4
model = so.nn.linen.ResidualMLP(features=32, num_blocks=2, out_features=8)
x = jax.random.normal(jax.random.key(1), (32, 16))
y = jax.random.normal(jax.random.key(2), (32, 8))
params = model.init(jax.random.key(0), x)["params"]
loss_fn = lambda p, x, y: jnp.mean((model.apply({"params": p}, x) - y) ** 2)

for name, tx in (("muon", so.muon(0.02, weight_decay=0.1)), ("moga", so.moga(0.01, p=2.5))):
    def step(p, s, x, y):
        g = jax.grad(loss_fn)(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    single = jax.jit(step)
    for _ in range(5):
        p, s = single(p, s, x, y)

    def pstep(p, s, x, y):
        g = jax.lax.pmean(jax.grad(loss_fn)(p, x, y), "batch")
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    rep = lambda t: jax.tree.map(lambda a: jnp.stack([a] * n), t)
    pp, ps = rep(params), rep(tx.init(params))
    xs, ys = x.reshape(n, -1, 16), y.reshape(n, -1, 8)
    parallel = jax.pmap(pstep, axis_name="batch")
    for _ in range(5):
        pp, ps = parallel(pp, ps, xs, ys)
    for a, b in zip(jax.tree.leaves(pp), jax.tree.leaves(p)):
        a = np.asarray(a)
        assert np.all(a == a[:1])  # still replicated
        np.testing.assert_allclose(a[0], np.asarray(b), rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b))))
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)))
    assert moved > 1e-3, moved  # the run did train
    print("ok", name)
"""


def test_pmap_data_parallel_equals_single_device():
    out = run_script(SCRIPT, devices=4)
    for name in ("muon", "moga"):
        assert f"ok {name}" in out, out
