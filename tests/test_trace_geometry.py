"""Geometry from the computation (``GeometryMap.from_apply`` / traced ``from_linen`` / ``from_nnx``).

The fixtures are written here in the styles of public Flax code (nothing is
vendored): a Hugging Face GPT-2 style block (``Conv1D`` kernels stored
``(features, in)`` and used as ``x @ kernel.T``, a fused ``c_attn`` split after
the product, a tied embedding read out through ``attend``); Gemma-style einsum
attention with grouped-query heads and a gated MLP with a stacked gate axis,
as Linen modules with weights named ``w``, ``gating_einsum``, ``linear`` and
with ``nnx.Einsum``; ``nn.ConvLocal``; a classifier whose head is ``Dense_3``
(BatchNorm inside); ``nn.scan`` / ``nnx.vmap`` stacks with unconventional
names; a default-named ``DenseGeneral`` with a ``(32, 4, 8)`` kernel.

Every decision is checked against a truth table written by hand from the
model code; from plain params each leaf is right or warned; one Muon step on
the traced geometry equals the step on the explicit (hand-written) geometry,
and for the GPT-2 block the step of the same model written with plain
``(in, out)`` kernels.
"""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _nn_reference import randomize
from flax import nnx

import spectral_optax as so
from spectral_optax import Geometry, GeometryMap


def path_str(path) -> str:
    """``'a/b/0'`` for a ``jax.tree_util`` key path (dict keys, attributes and sequence indices), without the
    trailing ``value`` of an NNX ``Param`` (the path a user writes, as in ``so.describe``)."""
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    while names and names[-1] in ("value", "raw_value"):
        names.pop()
    return "/".join(names)


# A truth entry: (kind, fan_in_axes, fan_out_axes, batch_axes, fan_out_splits, role).
M, E, V = "matrix", "embedding", "vector"


def t(kind, fan_in=(), fan_out=(), batch=(), splits=1, role="hidden"):
    return (kind, tuple(fan_in), tuple(fan_out), tuple(batch), splits, role)


def summary(g: Geometry):
    return (g.kind, g.fan_in_axes, g.fan_out_axes, g.batch_axes, g.fan_out_splits, g.role)


def decided(params, gmap):
    with warnings.catch_warnings():
        warnings.simplefilter("error", so.GeometryWarning)  # the trace decides every fixture leaf
        return {p: summary(g) for p, g in gmap.leaves(params)}


def check_truth(params, gmap, truth):
    got = decided(params, gmap)
    assert set(got) == set(truth), set(got) ^ set(truth)
    wrong = {p: (got[p], truth[p]) for p in truth if got[p] != truth[p]}
    assert not wrong, wrong


def check_plain(params, truth):
    """From plain params (name rules only): every leaf right, or warned (never silently wrong)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        got = {p: summary(g) for p, g in GeometryMap().leaves(params)}
    warned = {p for p in got if any(f"'{p}'" in str(w.message) for w in rec)}
    # An embedding's role routes nothing (every optimizer treats a table by its kind): a tied table's
    # 'output' role is the trace's to see, not the names'.
    same = lambda a, b: a == b or (a[0] == b[0] == E and a[:5] == b[:5])  # noqa: E731
    silent = {p: (got[p], truth[p]) for p in truth if not same(got[p], truth[p]) and p not in warned}
    return silent, warned


def truth_tree(params, truth):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = []
    for path, x in flat:
        kind, fi, fo, _, splits, role = truth[path_str(path)]
        if kind == V:
            leaves.append(Geometry(x.shape, V, (), fo, role=role))
        else:
            leaves.append(Geometry(x.shape, kind, fi, fo, fan_out_splits=splits, role=role))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def muon_step(params, geometry):
    tx = so.muon(0.1, geometry=geometry)
    grads = randomize(params, seed=5, scale=1.0)
    updates, _ = tx.update(grads, tx.init(params), params)
    return updates


def check_muon_matches_truth(params, gmap, truth):
    got = muon_step(params, gmap)
    ref = muon_step(params, GeometryMap(tree=truth_tree(params, truth)))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=path_str(path))


# ================================================================ Hugging Face GPT-2 style
class Conv1D(nn.Module):
    """A kernel stored (features, in), applied as x @ kernel.T (HF's FlaxConv1D layout)."""

    features: int

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.normal(0.02), (self.features, x.shape[-1]))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return x @ kernel.T + bias


class GPT2Attention(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        b, s, d = x.shape
        q, k, v = jnp.split(Conv1D(3 * d, name="c_attn")(x), 3, axis=2)
        q, k, v = (y.reshape(b, s, self.heads, d // self.heads) for y in (q, k, v))
        w = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // self.heads)
        w = jnp.where(jnp.tril(jnp.ones((s, s), bool)), w, -1e9)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(w, -1), v).reshape(b, s, d)
        return Conv1D(d, name="c_proj")(y)


class GPT2MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        return Conv1D(d, name="c_proj")(jax.nn.gelu(Conv1D(4 * d, name="c_fc")(x)))


class GPT2Block(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        x = x + GPT2Attention(self.heads, name="attn")(nn.LayerNorm(name="ln_1")(x))
        return x + GPT2MLP(name="mlp")(nn.LayerNorm(name="ln_2")(x))


class GPT2Blocks(nn.Module):
    layers: int
    heads: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.layers):
            x = GPT2Block(self.heads, name=str(i))(x)
        return x


class GPT2(nn.Module):
    vocab: int = 40
    d: int = 24
    heads: int = 2
    layers: int = 2
    positions: int = 16

    @nn.compact
    def __call__(self, tokens):
        wte = nn.Embed(self.vocab, self.d, name="wte")
        x = wte(tokens) + nn.Embed(self.positions, self.d, name="wpe")(jnp.arange(tokens.shape[-1]))
        x = GPT2Blocks(self.layers, self.heads, name="h")(x)
        return wte.attend(nn.LayerNorm(name="ln_f")(x))  # tied read-out


def gpt2_truth(layers=2):
    truth = {"wte/embedding": t(E, (0,), (1,), role="output"), "wpe/embedding": t(E, (0,), (1,))}
    truth |= {f"ln_f/{n}": t(V, (), (0,)) for n in ("scale", "bias")}
    for i in range(layers):
        b = f"h/{i}"
        truth |= {f"{b}/{ln}/{n}": t(V, (), (0,)) for ln in ("ln_1", "ln_2") for n in ("scale", "bias")}
        # (features, in) kernels: fan-in axis 1, fan-out axis 0; c_attn's output split in 3 after the product.
        truth[f"{b}/attn/c_attn/kernel"] = t(M, (1,), (0,), splits=3)
        for k in ("attn/c_proj", "mlp/c_fc", "mlp/c_proj"):
            truth[f"{b}/{k}/kernel"] = t(M, (1,), (0,))
        for k in ("attn/c_attn", "attn/c_proj", "mlp/c_fc", "mlp/c_proj"):
            truth[f"{b}/{k}/bias"] = t(V, (), (0,))
    return truth


TOKENS = jnp.zeros((2, 8), jnp.int32)


def test_gpt2_conv1d_transposed_kernels_fused_c_attn_and_tied_embedding():
    model = GPT2()
    params = model.init(jax.random.key(0), TOKENS)["params"]
    truth = gpt2_truth()
    check_truth(params, GeometryMap.from_apply(lambda p, x: model.apply({"params": p}, x), params, TOKENS), truth)
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_truth(params, gmap, truth)
    # The whole variables dict (paths with a leading 'params/') is decided the same way.
    full = {"params": params}
    check_truth(full, gmap, {f"params/{k}": v for k, v in truth.items()})
    # describe() says how each leaf was decided.
    rows = {r["path"]: r for r in so.describe(params, gmap, print_table=False)}
    assert rows["h/0/mlp/c_proj/kernel"]["decided_by"] == "trace: dot_general"
    assert "3 blocks" in rows["h/0/attn/c_attn/kernel"]["decided_by"]
    assert "tied" in rows["wte/embedding"]["decided_by"]
    # Plain params: the GPT-2 names with their shapes decide the transposed layout.
    silent, _ = check_plain(params, truth)
    assert not silent, silent


def test_init_with_geometry_one_trace_gives_init_values_and_the_traced_geometry():
    model = GPT2()
    key = jax.random.key(3)
    variables, gmap = so.init_with_geometry(model, key, TOKENS)
    ref = jax.jit(model.init)(key, TOKENS)
    assert jax.tree.structure(variables) == jax.tree.structure(ref)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(variables), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path_str(path))
    check_truth(variables["params"], gmap, gpt2_truth())
    # (what the geometry adds to init's time: benchmarks.trace_geometry_time)


def test_init_trace_falls_back_to_apply_for_a_parameter_it_cannot_place():
    table = np.ones((4, 3), np.float32)  # both parameters are this one constant in the init jaxpr

    class Shared(nn.Module):
        @nn.compact
        def __call__(self, x):
            a = self.param("a", lambda k, s: table, (4, 3))
            b = self.param("b", lambda k, s: table, (4, 3))
            return x @ a + x @ b

    x = jnp.ones((2, 4))
    _, gmap = so.init_with_geometry(Shared(), jax.random.key(0), x)
    check_truth({"a": table, "b": table}, gmap, {n: t(M, (0,), (1,), role="output") for n in "ab"})


def test_gpt2_muon_step_equals_plain_dense_model():
    model = GPT2()
    params = model.init(jax.random.key(0), TOKENS)["params"]
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_muon_matches_truth(params, gmap, gpt2_truth())
    # The same model with plain (in, out) kernels and explicit geometry: the update is the transpose.
    plain = jax.tree_util.tree_map_with_path(lambda p, x: x.T if path_str(p).endswith("kernel") else x, params)

    def geom(path, shape):
        if path.endswith("c_attn/kernel"):
            return Geometry.matrix(shape, fan_out_splits=3)
        return Geometry.matrix(shape) if path.endswith("kernel") else None

    tree = jax.tree_util.tree_map_with_path(lambda p, x: geom(path_str(p), x.shape), plain)
    tree = {**tree, "wte": {"embedding": Geometry.embedding((40, 24), role="output")}}
    grads = randomize(params, seed=5, scale=1.0)
    tx = so.muon(0.1, geometry=gmap)
    got, _ = tx.update(grads, tx.init(params), params)
    tx2 = so.muon(0.1, geometry=GeometryMap(tree=tree))
    plain_grads = jax.tree_util.tree_map_with_path(lambda p, x: x.T if path_str(p).endswith("kernel") else x, grads)
    ref, _ = tx2.update(plain_grads, tx2.init(plain), plain)
    for path, a in jax.tree_util.tree_leaves_with_path(got):
        b = ref
        for k in path:
            b = b[k.key]
        b = b.T if path_str(path).endswith("kernel") else b
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-7, err_msg=path_str(path))
    # The name-rule geometry the issue reported (fan-in and fan-out swapped) gives a different step.
    wrong = {r"c_proj/kernel$": "matrix"}
    bad = muon_step(params, gmap.with_overrides(wrong))
    assert not np.allclose(bad["h"]["0"]["mlp"]["c_proj"]["kernel"], got["h"]["0"]["mlp"]["c_proj"]["kernel"])


# ================================================================ Gemma style, Linen
class Einsum(nn.Module):
    """A parametrized einsum, the weight named as the caller says (Gemma's Linen layers name it 'w')."""

    shape: tuple
    weight_name: str = "w"

    @nn.compact
    def __call__(self, eqn, x):
        w = self.param(self.weight_name, nn.initializers.normal(), self.shape)
        return jnp.einsum(eqn, x, w)


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x**2, -1, keepdims=True) + 1e-6) * (1 + scale)


def gqa(q, k, v, kv_heads):
    b, s, n, h = q.shape
    q = q.reshape(b, s, kv_heads, n // kv_heads, h)
    logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k) / np.sqrt(h)
    enc = jnp.einsum("BTKGS,BSKH->BTKGH", jax.nn.softmax(logits, -1), v)
    return enc.reshape(b, s, n, h)


class GemmaAttention(nn.Module):
    heads: int
    kv_heads: int
    head_dim: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        q = Einsum((self.heads, d, self.head_dim), name="q_einsum")("BTD,NDH->BTNH", x)
        k, v = Einsum((2, self.kv_heads, d, self.head_dim), name="kv_einsum")("BSD,CKDH->CBSKH", x)
        enc = gqa(q, k, v, self.kv_heads)
        return Einsum((self.heads, self.head_dim, d), name="attn_vec_einsum")("BTNH,NHD->BTD", enc)


class GemmaMLP(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        gate = self.param("gating_einsum", nn.initializers.normal(), (2, d, self.hidden))
        g = jnp.einsum("...F,NFH->...NH", x, gate)
        h = jax.nn.gelu(g[..., 0, :]) * g[..., 1, :]
        return jnp.einsum("...H,HF->...F", h, self.param("linear", nn.initializers.normal(), (self.hidden, d)))


class GemmaLinen(nn.Module):
    vocab: int = 40
    d: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        table = self.param("input_embedding", nn.initializers.normal(), (self.vocab, self.d))  # under 'embedder'
        x = table[(tokens,)] * np.sqrt(self.d)
        for i in range(self.layers):
            blk = f"layer_{i}"
            x = x + GemmaAttention(self.heads, self.kv_heads, self.head_dim, name=f"{blk}_attn")(
                RMSNorm(name=f"{blk}_pre_attention_norm")(x)
            )
            x = x + GemmaMLP(64, name=f"{blk}_mlp")(RMSNorm(name=f"{blk}_pre_ffw_norm")(x))
        return jnp.dot(RMSNorm(name="final_norm")(x), table.T)  # tied decode


def gemma_linen_truth(layers=2):
    truth = {"input_embedding": t(E, (0,), (1,), role="output"), "final_norm/scale": t(V, (), (0,))}
    for i in range(layers):
        b = f"layer_{i}"
        truth |= {
            f"{b}_attn/q_einsum/w": t(M, (1,), (0, 2)),  # (N, D, H): 'BTD,NDH->BTNH'
            f"{b}_attn/kv_einsum/w": t(M, (2,), (1, 3), (0,)),  # (2, K, D, H): key / value stacked
            f"{b}_attn/attn_vec_einsum/w": t(M, (0, 1), (2,)),  # (N, H, D): heads contracted
            f"{b}_mlp/gating_einsum": t(M, (1,), (2,), (0,)),  # (2, F, H): gate / up stacked
            f"{b}_mlp/linear": t(M, (0,), (1,)),
            f"{b}_pre_attention_norm/scale": t(V, (), (0,)),
            f"{b}_pre_ffw_norm/scale": t(V, (), (0,)),
        }
    return truth


@pytest.mark.slow  # 34-58 s on the loaded 2-core CI machine (init + two Muon steps)
def test_gemma_linen_einsum_gqa_gated_mlp_tied():
    model = GemmaLinen()
    params = model.init(jax.random.key(0), TOKENS)["params"]
    truth = gemma_linen_truth()
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_truth(params, gmap, truth)
    check_truth(params, GeometryMap.from_apply(lambda p, x: model.apply({"params": p}, x), params, TOKENS), truth)
    check_muon_matches_truth(params, gmap, truth)
    silent, _ = check_plain(params, truth)
    assert not silent, silent


# ================================================================ Gemma style, NNX (nnx.Einsum)
class NNXGemmaBlock(nnx.Module):
    def __init__(self, d, heads, kv_heads, head_dim, hidden, rngs):
        self.kv_heads = kv_heads
        self.pre_attention_norm = nnx.RMSNorm(d, rngs=rngs)
        self.q_einsum = nnx.Einsum("BTD,NDH->BTNH", (heads, d, head_dim), rngs=rngs)
        self.kv_einsum = nnx.Einsum("BSD,CKDH->CBSKH", (2, kv_heads, d, head_dim), rngs=rngs)
        self.attn_vec_einsum = nnx.Einsum("BTNH,NHD->BTD", (heads, head_dim, d), rngs=rngs)
        self.pre_ffw_norm = nnx.RMSNorm(d, rngs=rngs)
        self.gating = nnx.Einsum("...F,NFH->...NH", (2, d, hidden), rngs=rngs)
        self.linear = nnx.Einsum("...H,HF->...F", (hidden, d), rngs=rngs)

    def __call__(self, x):
        h = self.pre_attention_norm(x)
        k, v = self.kv_einsum(h)
        x = x + self.attn_vec_einsum(gqa(self.q_einsum(h), k, v, self.kv_heads))
        g = self.gating(self.pre_ffw_norm(x))
        return x + self.linear(jax.nn.gelu(g[..., 0, :]) * g[..., 1, :])


class NNXGemma(nnx.Module):
    def __init__(self, rngs, vocab=40, d=32, layers=2):
        self.embedder = nnx.Embed(vocab, d, rngs=rngs)
        self.layers = nnx.List([NNXGemmaBlock(d, 4, 2, 8, 64, rngs) for _ in range(layers)])
        self.final_norm = nnx.RMSNorm(d, rngs=rngs)

    def __call__(self, tokens):
        x = self.embedder(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.embedder.attend(self.final_norm(x))


def nnx_gemma_truth(layers=2, mlp=True):
    """The true geometry of an NNX Gemma (tied embedder, einsum attention; with ``mlp`` the gated MLP)."""
    truth = {"embedder/embedding": t(E, (0,), (1,), role="output"), "final_norm/scale": t(V, (), (0,))}
    for i in range(layers):
        b = f"layers/{i}"
        truth |= {
            f"{b}/q_einsum/kernel": t(M, (1,), (0, 2)),
            f"{b}/kv_einsum/kernel": t(M, (2,), (1, 3), (0,)),
            f"{b}/attn_vec_einsum/kernel": t(M, (0, 1), (2,)),
            f"{b}/pre_attention_norm/scale": t(V, (), (0,)),
        }
        if mlp:
            truth |= {
                f"{b}/gating/kernel": t(M, (1,), (2,), (0,)),
                f"{b}/linear/kernel": t(M, (0,), (1,)),
                f"{b}/pre_ffw_norm/scale": t(V, (), (0,)),
            }
    return truth


def test_gemma_nnx_einsum():
    model = NNXGemma(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    truth = nnx_gemma_truth()
    gmap = GeometryMap.from_nnx(model, TOKENS)
    check_truth(state, gmap, truth)
    check_muon_matches_truth(state, gmap, truth)
    # Without example inputs the module hints read each nnx.Einsum's equation; whether an output axis is
    # a stack split after the product (kv / gate) or heads only the trace sees: every such leaf is warned.
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        hinted = {p: summary(g) for p, g in GeometryMap.from_nnx(model).leaves(state)}
    msgs = [str(w.message) for w in rec]
    warned = {p for p in hinted if any(f"'{p}'" in m and "example inputs" in m for m in msgs)}
    wrong = {p for p in truth if hinted[p][:5] != truth[p][:5]}  # (an embedding's role routes nothing)
    assert wrong == {f"layers/{i}/{n}/kernel" for i in range(2) for n in ("kv_einsum", "gating")}
    assert warned == wrong | {f"layers/{i}/q_einsum/kernel" for i in range(2)}  # heads or a stack? warned
    for i in range(2):
        assert hinted[f"layers/{i}/attn_vec_einsum/kernel"] == truth[f"layers/{i}/attn_vec_einsum/kernel"]
        assert hinted[f"layers/{i}/q_einsum/kernel"] == truth[f"layers/{i}/q_einsum/kernel"]
    silent, _ = check_plain(state, truth)
    assert not silent, silent


# ================================================================ ConvLocal, Dense_3 head, BatchNorm
class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.relu(nn.ConvLocal(4, (3, 3))(x))  # one 27 x 4 matrix per output position
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(32)(x))
        x = nn.relu(nn.Dense(32)(x))
        x = nn.LayerNorm()(nn.Dense(16)(x))
        return nn.log_softmax(nn.Dense(10)(x))  # the head is Dense_3


@pytest.mark.slow  # 34-58 s on the loaded 2-core CI machine (init + two Muon steps)
def test_convlocal_dense3_head_batchnorm():
    model = Classifier()
    x = jnp.ones((2, 8, 8, 3))
    variables = model.init(jax.random.key(0), x)
    params = variables["params"]
    assert params["ConvLocal_0"]["kernel"].shape == (8, 8, 27, 4)
    truth = {
        "ConvLocal_0/kernel": t(M, (2,), (3,), (0, 1)),
        "ConvLocal_0/bias": t(V, (), (2,), (0, 1)),
        "BatchNorm_0/scale": t(V, (), (0,)),
        "BatchNorm_0/bias": t(V, (), (0,)),
        "LayerNorm_0/scale": t(V, (), (0,)),
        "LayerNorm_0/bias": t(V, (), (0,)),
        "Dense_3/kernel": t(M, (0,), (1,), role="output"),
        "Dense_3/bias": t(V, (), (0,), role="output"),
    }
    for i in range(3):
        truth |= {f"Dense_{i}/kernel": t(M, (0,), (1,)), f"Dense_{i}/bias": t(V, (), (0,))}
    gmap = GeometryMap.from_linen(model, x)
    check_truth(params, gmap, truth)

    def apply(p, x):
        return model.apply({**variables, "params": p}, x, mutable=["batch_stats"])[0]

    check_truth(params, GeometryMap.from_apply(apply, params, x), truth)
    # Eval mode (running averages) decides the same.
    check_truth(params, GeometryMap.from_linen(model, x, train=False), truth)
    check_muon_matches_truth(params, gmap, truth)
    how = gmap.decided_by("Dense_3/kernel", (32 // 2, 10))
    assert how == "trace: dot_general, read-out; module hint said role 'hidden'"
    assert gmap.decided_by("ConvLocal_0/kernel", (8, 8, 27, 4)) == "trace: dot_general"
    k = gmap.tree(params)["ConvLocal_0"]["kernel"]
    assert (k.num_slices, k.d_in, k.d_out) == (64, 27, 4)
    # Plain params: ConvLocal by its name; the head Dense_3 guessed as the read-out, and warned.
    silent, warned = check_plain(params, truth)
    assert not silent and warned == {"Dense_3/kernel", "Dense_3/bias"}, (silent, warned)


# ================================================================ stacks with unconventional names
class ScanBody(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.relu(nn.Dense(24, name="fc1")(nn.LayerNorm(name="norm")(x)))
        return x + nn.Dense(16, name="fc2")(h), None


class ScanStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        stack = nn.scan(ScanBody, variable_axes={"params": 0}, split_rngs={"params": True}, length=5)
        x, _ = stack(name="trunk")(nn.Dense(16, name="stem")(x), None)
        proj = nn.DenseGeneral((4, 8))(x)  # default-named DenseGeneral: kernel (16, 4, 8)
        return nn.Dense(3, name="logitdense")(proj.reshape(x.shape[0], -1))


@pytest.mark.slow  # 34-58 s on the loaded 2-core CI machine (init + two Muon steps)
def test_linen_scan_stack_dense_general_and_logitdense():
    model = ScanStack()
    x = jnp.ones((2, 32))
    params = model.init(jax.random.key(0), x)["params"]
    truth = {
        "stem/kernel": t(M, (0,), (1,)),
        "stem/bias": t(V, (), (0,)),
        "trunk/fc1/kernel": t(M, (1,), (2,), (0,)),
        "trunk/fc1/bias": t(V, (), (1,), (0,)),
        "trunk/fc2/kernel": t(M, (1,), (2,), (0,)),
        "trunk/fc2/bias": t(V, (), (1,), (0,)),
        "trunk/norm/scale": t(V, (), (1,), (0,)),
        "trunk/norm/bias": t(V, (), (1,), (0,)),
        "DenseGeneral_0/kernel": t(M, (0,), (1, 2)),
        "DenseGeneral_0/bias": t(V, (), (0, 1)),
        "logitdense/kernel": t(M, (0,), (1,), role="output"),
        "logitdense/bias": t(V, (), (0,), role="output"),
    }
    gmap = GeometryMap.from_linen(model, x)
    check_truth(params, gmap, truth)
    check_truth(params, GeometryMap.from_apply(lambda p, x: model.apply({"params": p}, x), params, x), truth)
    check_muon_matches_truth(params, gmap, truth)
    silent, warned = check_plain(params, truth)
    assert not silent, silent
    assert {"trunk/fc1/kernel", "trunk/fc2/kernel", "DenseGeneral_0/kernel"} <= warned


class NNXBlock(nnx.Module):
    def __init__(self, rngs):
        self.gain = nnx.LayerNorm(8, rngs=rngs)
        self.w_in = nnx.Linear(8, 20, rngs=rngs)
        self.w_out = nnx.Linear(20, 8, rngs=rngs)

    def __call__(self, x):
        return x + self.w_out(nnx.relu(self.w_in(self.gain(x))))


class NNXStack(nnx.Module):
    def __init__(self, rngs):
        keys = jax.random.split(rngs.params(), 3)
        self.tower = nnx.vmap(lambda k: NNXBlock(nnx.Rngs(k)))(keys)
        self.readout = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(x, block):
            return block(x)

        return self.readout(run(x, self.tower))


def test_nnx_vmap_stack_unconventional_names():
    model = NNXStack(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    truth = {
        "tower/gain/scale": t(V, (), (1,), (0,)),
        "tower/gain/bias": t(V, (), (1,), (0,)),
        "tower/w_in/kernel": t(M, (1,), (2,), (0,)),
        "tower/w_in/bias": t(V, (), (1,), (0,)),
        "tower/w_out/kernel": t(M, (1,), (2,), (0,)),
        "tower/w_out/bias": t(V, (), (1,), (0,)),
        "readout/kernel": t(M, (0,), (1,), role="output"),
        "readout/bias": t(V, (), (0,), role="output"),
    }
    gmap = GeometryMap.from_nnx(model, jnp.ones((2, 8)))
    check_truth(state, gmap, truth)
    check_muon_matches_truth(state, gmap, truth)


# ================================================================ undecidable: loud, never silent
def test_opaque_use_falls_back_with_a_warning_naming_the_reason():
    def apply(p, x):
        w = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((4, 3, 2), jnp.float32), p["w"])
        return x @ p["m"] + w.sum()

    params = {"w": jnp.ones((4, 3, 2)), "m": jnp.ones((5, 6))}
    gmap = GeometryMap.from_apply(apply, params, jnp.ones((2, 5)))
    with pytest.warns(so.GeometryWarning, match=r"'w'.*the trace could not decide it"):
        g = dict(gmap.leaves(params))
    assert g["w"].kind == "elementwise" and summary(g["m"]) == t(M, (0,), (1,), role="output")
    assert gmap.decided_by("w", (4, 3, 2)).startswith("fallback: element-wise (trace:")
    with pytest.raises(so.GeometryError, match="the trace cannot decide parameter 'w'"):
        GeometryMap.from_apply(apply, params, jnp.ones((2, 5)), strict=True).leaves(params)


def test_unequal_fused_split_is_undecided_not_silently_split():
    # A fused projection cut into unequal blocks (GQA q / k / v of different widths) has no Geometry.
    def apply(p, x):
        y = x @ p["wqkv"]
        q, k, v = jnp.split(y, [8, 12], axis=-1)
        return q.sum() + k.sum() + v.sum()

    params = {"wqkv": jnp.ones((8, 16))}
    gmap = GeometryMap.from_apply(apply, params, jnp.ones((2, 8)))
    with pytest.warns(so.GeometryWarning, match=r"(?s)'wqkv'.*unequal.*\(8, 4, 4\).*Fix it with an override"):
        assert gmap.tree(params)["wqkv"].kind == "elementwise"


def test_overrides_win_over_the_trace_and_untraceable_apply_is_a_clear_error():
    params = {"k": jnp.ones((4, 6))}
    gmap = GeometryMap.from_apply(lambda p, x: x @ p["k"].T, params, jnp.ones((2, 6)), overrides={"k$": "matrix"})
    assert summary(gmap.tree(params)["k"]) == t(M, (0,), (1,))
    assert gmap.decided_by("k", (4, 6)) == "override 'k$'"

    def concrete(p, x):
        if float(x.sum()) > 0:  # needs values: not traceable on shapes
            return x
        return x @ p["k"]

    with pytest.raises(so.GeometryError, match="could not trace apply_fn"):
        GeometryMap.from_apply(concrete, params, jnp.ones((2, 4)))


# ================================================================ the package's own models: no change
def package_model_layout(path: str, shape: tuple, stacked: bool):
    """The layout of a leaf of the package's Transformer / ResNet, from the Flax layers that make it.

    Scanned (NNX: stacked) blocks carry the block index as a leading batch axis. ``DenseGeneral`` q/k/v
    kernels are ``(d, heads, head_dim)`` (fan-in 0, fan-out 1-2), the attention output ``(heads, head_dim,
    d)`` (fan-in 0-1); a fused qkv kernel is ``(d, 3 d)`` with three fan-out splits; a conv kernel is
    ``(kh, kw, in, out)``; embeddings are ``(vocab, d)``; biases and norm scales are vectors; ``head`` is
    the read-out.
    """
    o = 1 if stacked and path.startswith("blocks/") else 0
    batch = (0,) if o else ()
    leaf = path.rsplit("/", 1)[-1]
    role = "output" if path.startswith("head/") else "hidden"
    if leaf in ("bias", "scale"):
        return t(V, (), tuple(range(o, len(shape))), batch, role=role)
    if leaf == "embedding":
        return t(E, (0,), (1,))
    layer = path.rsplit("/", 2)[-2]
    if layer in ("query", "key", "value"):
        return t(M, (o,), (o + 1, o + 2), batch)
    if path.endswith("attn/out/kernel"):
        return t(M, (o, o + 1), (o + 2,), batch)
    if len(shape) - o == 4:  # conv
        return t(M, (0, 1, 2), (3,))
    return t(M, (o,), (o + 1,), batch, splits=3 if layer == "qkv" else 1, role=role)


@pytest.mark.parametrize("which", ["linen_scan", "linen_unrolled_fused", "linen_resnet", "nnx_transformer"])
def test_package_models_every_leaf_traced_and_unchanged(which):
    tok, img = jnp.zeros((2, 8), jnp.int32), jnp.ones((2, 8, 8, 3))
    L = so.nn.linen
    if which == "nnx_transformer":
        model = so.nn.nnx.Transformer(32, 16, 2, 2, max_len=8, qkv="fused", rngs=nnx.Rngs(0))
        params, gmap = nnx.state(model, nnx.Param), GeometryMap.from_nnx(model, tok)
    else:
        model, x = {
            "linen_scan": (L.Transformer(vocab_size=32, features=16, num_blocks=2, num_heads=2, max_len=8), tok),
            "linen_unrolled_fused": (
                L.Transformer(
                    vocab_size=32, features=16, num_blocks=2, num_heads=2, max_len=8, scan=False, qkv="fused"
                ),
                tok,
            ),
            "linen_resnet": (L.ResNet(features=8, num_blocks=2, num_classes=3), img),
        }[which]
        params, gmap = model.init(jax.random.key(0), x)["params"], GeometryMap.from_linen(model, x)
    # The trace decides every leaf, with the layout the models' Flax layers define (written out below,
    # independently of the package's name rules).
    assert all(d.geometry is not None for d in gmap.traced.values()), {
        k: d.reason for k, d in gmap.traced.items() if d.geometry is None
    }
    expected = {p: package_model_layout(p, g.shape, stacked=which in ("linen_scan", "nnx_transformer"))
                for p, g in gmap.leaves(params)}  # fmt: skip
    assert {p: summary(g) for p, g in gmap.leaves(params)} == expected
    assert all(gmap.decided_by(p, g.shape).startswith("trace: ") for p, g in gmap.leaves(params))
    if which == "linen_scan":  # one trace of init: the stacked parameters are made inside the scan body
        variables, g1 = so.init_with_geometry(model, jax.random.key(0), x)
        ref = jax.jit(model.init)(jax.random.key(0), x)
        assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), variables, ref))
        assert {p: summary(g) for p, g in g1.leaves(params)} == expected


def test_lab_model_geometry_from_its_forward_pass():
    from spectral_optax import lab

    x = jnp.ones((2, 12))
    model = lab.Model.from_linen(lab.MLP(width=16, depth=2, num_outputs=3), x)
    gmap = model.geometry(x)
    got = {p: summary(g) for p, g in gmap.leaves(model.shapes())}
    hidden = t(M, (0,), (1,))
    assert got == {"Dense_in/kernel": hidden, "Dense_0/kernel": hidden, "Dense_1/kernel": hidden,
                   "head/kernel": t(M, (0,), (1,), role="output")}  # fmt: skip
    assert gmap.decided_by("head/kernel", (16, 3)) == "trace: dot_general, read-out"
