"""spectral_optax.nn: residual blocks h + alpha f(h) in Linen and NNX.

Forward passes are checked against a float64 NumPy reference written here;
parameter paths and stacked-layer geometry against the conventions the
depth transform and the optimizers rely on.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _nn_reference import f64 as _np
from _nn_reference import randomize as _randomize
from flax import nnx

import spectral_optax as so
from spectral_optax.nn import linen as L
from spectral_optax.nn import nnx as N

# Every comparison here (with float64 NumPy, or between two float32 forms) runs
# at float32-accurate matmuls: a GPU's default float32 precision is TF32 and
# a TPU's one bfloat16 pass, far outside 1e-5..2e-5 (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("highest_precision")

K, WIDTH, D_IN, D_OUT = 4, 8, 5, 3


def reference_residual_mlp(p, x, alpha, embed=None):
    """float64 NumPy forward of the residual MLP from its parameter dict."""
    x = _np(x)
    if embed is not None:
        x = _np(embed)[np.asarray(x, int)].reshape(x.shape[0], -1)
    h = x @ _np(p["input_proj"]["kernel"]) + _np(p["input_proj"]["bias"])
    b = p["blocks"]
    for k in range(_np(b["dense_0"]["kernel"]).shape[0]):
        z = np.maximum(h @ _np(b["dense_0"]["kernel"])[k] + _np(b["dense_0"]["bias"])[k], 0)
        h = h + alpha * (z @ _np(b["dense_1"]["kernel"])[k] + _np(b["dense_1"]["bias"])[k])
    return h @ _np(p["head"]["kernel"]) + _np(p["head"]["bias"])


@functools.cache
def _x():
    return jax.random.normal(jax.random.key(7), (6, D_IN))


def _init(model, x):
    return jax.jit(model.init)(jax.random.key(0), x)["params"]


def _apply(model, p, x):
    return _np(jax.jit(model.apply)({"params": p}, x))


def test_linen_residual_mlp_matches_numpy():
    p = _randomize(_init(L.ResidualMLP(WIDTH, K, D_OUT), _x()))
    for alpha, expected in [(None, 2 / K), (1.0, 1.0), (0.3, 0.3)]:
        m = L.ResidualMLP(WIDTH, K, D_OUT, alpha=alpha)
        assert m.branch_alpha == pytest.approx(expected)
        np.testing.assert_allclose(_apply(m, p, _x()), reference_residual_mlp(p, _x(), expected),
                                   rtol=2e-5, atol=2e-5)


def test_linen_unrolled_equals_scanned():
    scanned = L.ResidualMLP(WIDTH, K, D_OUT)
    unrolled = L.ResidualMLP(WIDTH, K, D_OUT, scan=False)
    p = _randomize(_init(scanned, _x()))
    pu = {"input_proj": p["input_proj"], "head": p["head"]}
    for k in range(K):
        pu[f"blocks_{k}"] = jax.tree_util.tree_map(lambda a, k=k: a[k], p["blocks"])
    assert jax.tree_util.tree_structure(pu) == jax.tree_util.tree_structure(
        jax.eval_shape(unrolled.init, jax.random.key(0), _x())["params"])
    np.testing.assert_allclose(_apply(unrolled, pu, _x()), _apply(scanned, p, _x()),
                               rtol=1e-5, atol=1e-6)
    # The branch pattern finds the last layer of every unrolled block too.
    chosen = [path for path, _ in so.GeometryMap().leaves(pu)
              if re.search(so.expert.BRANCH_OUT_PATTERN, path)]
    assert sorted(chosen) == sorted(f"blocks_{k}/dense_1/{n}" for k in range(K)
                                    for n in ("bias", "kernel"))


def test_linen_byte_inputs_and_absorbed_init():
    tokens = jax.random.randint(jax.random.key(1), (6, 4), 0, 11)
    m = L.ResidualMLP(WIDTH, K, D_OUT, vocab_size=11)
    p = _randomize(_init(m, tokens))
    np.testing.assert_allclose(
        _apply(m, p, tokens),
        reference_residual_mlp(p, tokens, 2 / K, embed=p["embed"]["embedding"]),
        rtol=2e-5, atol=2e-5)
    # Absorbed form: unit multiplier, dense_1 init times alpha, same function at init.
    ma = L.ResidualMLP(WIDTH, K, D_OUT, vocab_size=11, absorbed=True)
    p0, pa = _init(m, tokens), _init(ma, tokens)
    np.testing.assert_allclose(_np(pa["blocks"]["dense_1"]["kernel"]),
                               (2 / K) * _np(p0["blocks"]["dense_1"]["kernel"]), rtol=1e-6)
    np.testing.assert_allclose(_np(pa["blocks"]["dense_0"]["kernel"]),
                               _np(p0["blocks"]["dense_0"]["kernel"]))
    np.testing.assert_allclose(_apply(ma, pa, tokens), _apply(m, p0, tokens),
                               rtol=1e-5, atol=1e-6)


def test_linen_stacked_geometry_inferred_from_names():
    m = L.ResidualMLP(WIDTH, K, D_OUT)
    p = jax.eval_shape(m.init, jax.random.key(0), _x())["params"]
    geoms = dict(so.GeometryMap().leaves(p))  # no model given: naming rules only
    for name in ("dense_0", "dense_1"):
        g = geoms[f"blocks/{name}/kernel"]
        assert (g.kind, g.batch_axes, g.d_in, g.d_out, g.num_slices) == ("matrix", (0,), 8, 8, K)
        b = geoms[f"blocks/{name}/bias"]
        assert (b.kind, b.batch_axes, b.d_out) == ("vector", (0,), 8)
    assert geoms["head/kernel"].role == "output"


def test_nnx_residual_mlp_matches_numpy_and_linen_paths():
    m = N.ResidualMLP(D_IN, WIDTH, K, D_OUT, rngs=nnx.Rngs(0))
    state = nnx.state(m, nnx.Param)
    new = _randomize(state)
    nnx.update(m, new)
    p = jax.tree_util.tree_map(lambda v: v, nnx.to_pure_dict(new))
    np.testing.assert_allclose(_np(m(_x())), reference_residual_mlp(p, _x(), 2 / K),
                               rtol=2e-5, atol=2e-5)
    linen_paths = {path for path, _ in so.GeometryMap().leaves(
        jax.eval_shape(L.ResidualMLP(WIDTH, K, D_OUT).init, jax.random.key(0), _x())["params"])}
    nnx_geoms = dict(so.as_geometry_map(m).leaves(state))
    assert set(nnx_geoms) == linen_paths
    assert nnx_geoms["blocks/dense_1/kernel"].batch_axes == (0,)
    # Absorbed NNX model: same function at init as the explicit one with depth_scaled_init.
    me = N.ResidualMLP(D_IN, WIDTH, K, D_OUT, rngs=nnx.Rngs(1))
    ma = N.ResidualMLP(D_IN, WIDTH, K, D_OUT, absorbed=True, rngs=nnx.Rngs(1))
    sa = nnx.state(ma, nnx.Param)
    scaled = so.depth_scaled_init(nnx.state(me, nnx.Param), K)
    for a, b in zip(jax.tree_util.tree_leaves(sa), jax.tree_util.tree_leaves(scaled)):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_np(ma(_x())), _np(me(_x())), rtol=1e-5, atol=1e-6)


def _future_changed(tokens, t):
    return tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 1) % 13)


def test_linen_transformer_causal_branches_and_geometry():
    tokens = jax.random.randint(jax.random.key(2), (2, 6), 0, 13)
    m = L.Transformer(13, 16, K, num_heads=2, max_len=8)
    p = _init(m, tokens)
    out = _apply(m, p, tokens)
    assert out.shape == (2, 6, 13) and bool(np.all(np.isfinite(out)))
    out2 = _apply(m, p, _future_changed(tokens, 2))
    np.testing.assert_allclose(out2[:, :3], out[:, :3], rtol=1e-5, atol=1e-5)
    assert float(np.abs(out2[:, 3:] - out[:, 3:]).max()) > 1e-4
    chosen = sorted(path for path, _ in so.GeometryMap().leaves(p)
                    if re.search(so.expert.BRANCH_OUT_PATTERN, path))
    assert chosen == ["blocks/attn/out/bias", "blocks/attn/out/kernel",
                      "blocks/mlp/dense_1/bias", "blocks/mlp/dense_1/kernel"]
    geoms = dict(so.GeometryMap.from_linen(m, tokens).leaves(p))
    out_k = geoms["blocks/attn/out/kernel"]
    assert (out_k.batch_axes, out_k.d_in, out_k.d_out) == ((0,), 16, 16)
    assert geoms["blocks/ln_attn/scale"].batch_axes == (0,)
    # Absorbed form == explicit form at init.
    ma = L.Transformer(13, 16, K, num_heads=2, max_len=8, absorbed=True)
    pa = so.depth_scaled_init(p, K)
    np.testing.assert_allclose(_apply(ma, pa, tokens), out, rtol=1e-4, atol=1e-5)


def test_nnx_transformer_causal_and_paths():
    tokens = jax.random.randint(jax.random.key(2), (2, 6), 0, 13)
    m = N.Transformer(13, 16, K, num_heads=2, max_len=8, rngs=nnx.Rngs(0))
    fwd = nnx.jit(lambda model, t: model(t))
    out = _np(fwd(m, tokens))
    assert out.shape == (2, 6, 13)
    out2 = _np(fwd(m, _future_changed(tokens, 2)))
    np.testing.assert_allclose(out2[:, :3], out[:, :3], rtol=1e-5, atol=1e-5)
    state = nnx.state(m, nnx.Param)
    geoms = dict(so.as_geometry_map(m).leaves(state))
    chosen = sorted(p for p in geoms if re.search(so.expert.BRANCH_OUT_PATTERN, p))
    assert chosen == ["blocks/attn/out/bias", "blocks/attn/out/kernel",
                      "blocks/mlp/dense_1/bias", "blocks/mlp/dense_1/kernel"]
    assert geoms["blocks/attn/query/kernel"].batch_axes == (0,)
    assert geoms["blocks/ln_mlp/scale"].batch_axes == (0,)


def test_param_dtype_bf16():
    m = L.ResidualMLP(WIDTH, K, D_OUT, param_dtype=jnp.bfloat16, absorbed=True)
    p = _init(m, _x())
    assert {x.dtype for x in jax.tree_util.tree_leaves(p)} == {jnp.dtype(jnp.bfloat16)}
    assert bool(np.all(np.isfinite(_apply(m, p, _x()))))


def test_nnx_fused_attention_sows_max_logits_by_name():
    """FusedSelfAttention(record_max_logits=True) sows 'max_logits' of shape (num_heads,)."""
    m = so.nn.nnx.FusedSelfAttention(8, 2, record_max_logits=True, rngs=nnx.Rngs(0))
    _, inter = nnx.capture(m, nnx.Intermediate)(jnp.ones((1, 3, 8)))
    (leaf,) = jax.tree.leaves(inter["max_logits"])
    assert leaf.shape == (2,)


def test_nnx_transformer_uses_embedding_init():
    """Transformer(embedding_init=...) initializes the token embedding with it."""
    m = so.nn.nnx.Transformer(
        11, 8, 1, 2, max_len=4, scan=False, embedding_init=nnx.initializers.ones, rngs=nnx.Rngs(0)
    )
    np.testing.assert_array_equal(np.asarray(m.embed.embedding[...]), np.ones((11, 8)))
    np.testing.assert_array_equal(np.asarray(m.pos_embed.embedding[...]), np.ones((4, 8)))
