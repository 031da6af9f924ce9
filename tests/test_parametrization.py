"""Parametrization-1 multipliers, base shapes, mup_sgd / mup_adamw, describe."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax import GeometryError


def path_str(path) -> str:
    """``'a/b/0'`` for a ``jax.tree_util`` key path (dict keys, attributes and sequence indices)."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)



def mlp_params(width, d_in=3072, d_out=1, bias=True):
    return {
        "Dense_0": {"kernel": jnp.zeros((d_in, width))} | ({"bias": jnp.zeros((width,))} if bias else {}),
        "Dense_1": {"kernel": jnp.zeros((width, width))},
        "head": {"kernel": jnp.zeros((width, d_out))},
    }


def test_reference_worked_example():
    # docs/math.md section 2: input 3072, hidden 4096, one output, eta0 = 0.1.
    p = mlp_params(4096, bias=False)
    lrs = {path: 0.1 * so.expert.lr_multiplier(g, "sgd") for path, g in so.as_geometry_map().leaves(p)}
    np.testing.assert_allclose(
        [lrs["Dense_0/kernel"], lrs["Dense_1/kernel"], lrs["head/kernel"]], [0.1333, 0.1, 2.44e-5], rtol=2e-3
    )


def test_adam_and_sgd_tables():
    g = dict(so.as_geometry_map().leaves(mlp_params(256, d_in=10, d_out=5) | {"Embed_0": {"embedding": jnp.zeros((7, 256))}}))
    # Adam (muP Table 3): hidden and output 1/n, input, biases, embeddings 1.
    assert so.expert.lr_multiplier(g["Dense_1/kernel"], "adam") == pytest.approx(1 / 256)
    assert so.expert.lr_multiplier(g["head/kernel"], "adam") == pytest.approx(1 / 256)
    assert so.expert.lr_multiplier(g["Dense_0/kernel"], "adam") == pytest.approx(1 / 10)
    assert so.expert.lr_multiplier(g["Dense_0/bias"], "adam") == 1.0
    assert so.expert.lr_multiplier(g["Embed_0/embedding"], "adam") == 1.0
    # SGD: d_out / n_in; embeddings and biases d_out.
    assert so.expert.lr_multiplier(g["Embed_0/embedding"], "sgd") == 256
    assert so.expert.lr_multiplier(g["Dense_0/bias"], "sgd") == 256
    assert so.expert.lr_multiplier(g["head/kernel"], "sgd") == pytest.approx(5 / 256)


def run(tx, params, grads_seq):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for grads in grads_seq:
        u, state = update(grads, state, params)
        params = optax.apply_updates(params, u)
    return params


def random_grads(params, n, seed=0):
    keys = jax.random.split(jax.random.key(seed), n)
    return [jax.tree.map(lambda x, k=k: jax.random.normal(k, x.shape, x.dtype), params) for k in keys]


def test_base_width_coincides_with_standard_optimizers():
    params = jax.tree.map(lambda x: x + 0.1, mlp_params(64, d_in=16, d_out=4))
    grads = random_grads(params, 4)
    for ours, ref in [
        (so.mup_sgd(0.05, base=params), optax.sgd(0.05)),
        (so.mup_sgd(0.05, base=params, momentum=0.9), optax.sgd(0.05, momentum=0.9)),
        (
            so.mup_adamw(1e-2, base=params, weight_decay=0.1),
            optax.adamw(1e-2, weight_decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
        ),
    ]:
        a, b = run(ours, params, grads), run(ref, params, grads)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b)


def test_relative_multipliers_at_wider_model():
    base = mlp_params(64, d_in=16, d_out=4)
    wide = mlp_params(1024, d_in=16, d_out=4)
    grads = jax.tree.map(jnp.ones_like, wide)
    zeros = jax.tree.map(jnp.zeros_like, wide)
    for kind, expected in [
        ("sgd", {"Dense_0/kernel": 16, "Dense_0/bias": 16, "Dense_1/kernel": 1, "head/kernel": 1 / 16}),
        ("adam", {"Dense_0/kernel": 1, "Dense_0/bias": 1, "Dense_1/kernel": 1 / 16, "head/kernel": 1 / 16}),
    ]:
        tx = so.scale_by_parametrization1(kind, base=base)
        u, _ = tx.update(grads, tx.init(zeros), zeros)
        got = {
            "/".join(str(k.key) for k in path): float(x.reshape(-1)[0])
            for path, x in jax.tree_util.tree_flatten_with_path(u)[0]
        }
        assert got == pytest.approx(expected)


def test_missing_base_leaf_names_path():
    base = {"Dense_0": {"kernel": jnp.zeros((4, 4))}}
    params = base | {"Dense_9": {"kernel": jnp.zeros((4, 4))}}
    tx = so.mup_sgd(0.1, base=base)
    with pytest.raises(GeometryError, match="Dense_9/kernel"):
        tx.update(params, tx.init(params), params)


def test_zero_gradients_and_bf16():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), mlp_params(32, d_in=8, d_out=2))
    zeros = jax.tree.map(jnp.zeros_like, params)
    for tx in [so.mup_sgd(0.1), so.mup_adamw(0.1, weight_decay=0.0), so.spectral_sgd(0.1)]:
        u, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
        for x in jax.tree.leaves(u):
            assert x.dtype == jnp.bfloat16 and not np.any(np.isnan(np.asarray(x, np.float32)))
            assert np.all(np.asarray(x, np.float32) == 0)


def test_mup_adamw_inject_hyperparams_and_schedule():
    params = mlp_params(32, d_in=8, d_out=2)
    grads = jax.tree.map(jnp.ones_like, params)
    tx = optax.inject_hyperparams(so.mup_adamw)(learning_rate=optax.linear_schedule(1e-2, 0.0, 10), base=params)
    state = tx.init(params)
    u, state = jax.jit(tx.update)(grads, state, params)
    np.testing.assert_allclose(np.asarray(u["Dense_1"]["kernel"]), -1e-2, rtol=1e-5)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(1e-2)


class TinyGPT(nn.Module):
    width: int = 32

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(64, self.width)(tokens)
        h = nn.MultiHeadDotProductAttention(num_heads=2)(nn.LayerNorm()(x))
        x = x + h
        x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
        return nn.Dense(64, name="head")(x)


def test_describe_real_transformer(capsys):
    tokens = jnp.zeros((1, 4), jnp.int32)
    base = TinyGPT(32).init(jax.random.key(0), tokens)["params"]
    wide = TinyGPT(128).init(jax.random.key(0), tokens)["params"]
    rows = {r["path"]: r for r in so.describe(wide, base=base)}
    out = capsys.readouterr().out
    assert "MultiHeadDotProductAttention_0/query/kernel" in out and "target_norm" in out
    q = rows["MultiHeadDotProductAttention_0/query/kernel"]
    assert (q["d_in"], q["d_out"], q["kind"]) == (128, 128, "matrix")
    assert q["lr_sgd"] == pytest.approx(1.0) and q["lr_adam"] == pytest.approx(1 / 4)
    assert rows["head/kernel"]["kind"] == "matrix/output"
    assert rows["head/kernel"]["lr_sgd"] == pytest.approx(1 / 4)
    assert rows["Embed_0/embedding"]["lr_adam"] == 1.0
    assert rows["Embed_0/embedding"]["lr_sgd"] == pytest.approx(4.0)
    assert rows["Dense_1/kernel"]["target_norm"] == pytest.approx(2.0)  # 128 -> 512
    assert rows["Dense_0/kernel"]["target_norm"] == pytest.approx(0.5)  # 512 -> 128 (constructed first)


# --------------------------------------------------------------------------
# route_lr_scale: per-route multipliers after a complete optimizer.
# --------------------------------------------------------------------------
def routed_params(dtype=jnp.float32):
    k = jax.random.split(jax.random.key(3), 5)
    return {
        "embed": {"embedding": jax.random.normal(k[0], (12, 8), dtype)},
        "Dense_0": {"kernel": jax.random.normal(k[1], (8, 8), dtype), "bias": jnp.zeros((8,), dtype)},
        "LayerNorm_0": {"scale": jnp.ones((8,), dtype)},
        "head": {"kernel": jax.random.normal(k[2], (8, 5), dtype)},
    }


ROUTE_OF_PATH = {"embed/embedding": "embedding", "Dense_0/kernel": "hidden", "Dense_0/bias": "vector",
                 "LayerNorm_0/scale": "vector", "head/kernel": "output"}


def adam_reference(params, grads_seq, lr, factors, b1=0.9, b2=0.999, eps=1e-8):
    """float64 NumPy Adam (bias-corrected), each leaf's step times its route's factor."""
    flat = {path_str(p): np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    m = {k: np.zeros_like(v) for k, v in flat.items()}
    v2 = {k: np.zeros_like(v) for k, v in flat.items()}
    for t, grads in enumerate(grads_seq, start=1):
        g = {path_str(p): np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(grads)[0]}
        for k in flat:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
            step = (m[k] / (1 - b1**t)) / (np.sqrt(v2[k] / (1 - b2**t)) + eps)
            flat[k] = flat[k] - lr * factors.get(ROUTE_OF_PATH[k], 1.0) * step
    return flat


@pytest.mark.parametrize("factors", [{"embedding": 16.0}, {"output": 0.25, "vector": 3.0, "hidden": 2.0}])
def test_route_lr_scale_against_float64_adam(factors):
    params = routed_params()
    grads_seq = random_grads(params, 3, seed=1)
    got = run(optax.chain(optax.adam(1e-2), so.route_lr_scale(**factors)), params, grads_seq)
    want = adam_reference(params, grads_seq, 1e-2, factors)
    start = {
        path_str(p): np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    for p, x in jax.tree_util.tree_flatten_with_path(got)[0]:
        k = path_str(p)
        # The change of each leaf; 2e-4: optax's float32 bias correction 1 - 0.999^t (1e-4 relative at t <= 3).
        np.testing.assert_allclose(np.asarray(x, np.float64) - start[k], want[k] - start[k], rtol=2e-4, atol=1e-7,
                                   err_msg=k)
    # Routes as the geometry decides them (the reference's table is written by hand).
    assert {p: so.expert.route_of(g) for p, g in so.as_geometry_map().leaves(params)} == ROUTE_OF_PATH


def test_route_lr_scale_multisteps_inject_and_dtype():
    params = routed_params()
    grads_seq = random_grads(params, 4, seed=2)
    # MultiSteps: 2 micro-batches per step, so the reference sees the means of pairs.
    tx = optax.MultiSteps(optax.chain(optax.adam(1e-2), so.route_lr_scale(embedding=8.0)), every_k_schedule=2)
    got = run(tx, params, grads_seq)
    pairs = [jax.tree.map(lambda a, b: (a + b) / 2, grads_seq[i], grads_seq[i + 1]) for i in (0, 2)]
    want = adam_reference(params, pairs, 1e-2, {"embedding": 8.0})
    e0 = np.asarray(params["embed"]["embedding"], np.float64)
    np.testing.assert_allclose(np.asarray(got["embed"]["embedding"], np.float64) - e0, want["embed/embedding"] - e0,
                               rtol=2e-4, atol=1e-7)
    # inject_hyperparams: the multiplier as a (traced) hyperparameter.
    inj = optax.inject_hyperparams(so.route_lr_scale)(embedding=8.0)
    u, _ = inj.update(grads_seq[0], inj.init(params), params)
    np.testing.assert_allclose(u["embed"]["embedding"], 8.0 * grads_seq[0]["embed"]["embedding"], rtol=1e-6)
    np.testing.assert_array_equal(u["head"]["kernel"], grads_seq[0]["head"]["kernel"])
    # bfloat16 updates stay bfloat16.
    pb = routed_params(jnp.bfloat16)
    tx = so.route_lr_scale(embedding=4.0)
    u, _ = tx.update(pb, tx.init(pb), pb)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(u))


def test_route_lr_scale_bad_values():
    with pytest.raises(ValueError, match=r"embedding=-1.0 must be a finite number >= 0"):
        so.route_lr_scale(embedding=-1.0)
    with pytest.raises(ValueError, match=r"output=nan"):
        so.route_lr_scale(output=float("nan"))
    no_embedding = {"Dense_0": {"kernel": jnp.zeros((4, 4))}, "head": {"kernel": jnp.zeros((4, 2))}}
    with pytest.raises(GeometryError, match=r"no parameter has route \['embedding'\].*hidden \(1: Dense_0/kernel\)"):
        so.route_lr_scale(embedding=16.0).init(no_embedding)
    so.route_lr_scale(output=2.0).init(no_embedding)  # a route the model has: fine
