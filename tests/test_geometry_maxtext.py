"""Plain parameter trees in MaxText's layouts (issue 52), decided from the names and shapes alone.

The paths and shapes are those of AI-Hypercomputer/maxtext's decoders (read from its source, nothing
vendored): ``param_scan_axis: 1`` (its default) stacks the layers on axis 1, so ``query/kernel`` is
``(embed, layers, heads, head_dim)``, ``out/kernel`` ``(heads, layers, head_dim, embed)``, the MLP's
kernels ``(embed, layers, mlp)``, the norms ``(embed, layers)``, the experts ``(experts, layers, embed,
mlp)``. Six trees: Llama-2 scanned (Linen and NNX roots), unscanned, tied, Mixtral, DeepSeek-V3 (MLA).
Every leaf is right or warned, every warning's override is right for its leaf (applied and compared
with the truth), and MaxText's own Muon dimension numbers are accepted as the geometry.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import pytest
from optax.contrib import MuonDimensionNumbers as mdn
from test_trace_geometry import E, M, V, summary, t

import spectral_optax as so
from spectral_optax import GeometryMap

D, L, N, K, H, F, VOCAB, X = 16, 3, 4, 2, 8, 24, 40, 4  # embed, layers, heads, kv heads, head_dim, mlp, vocab, experts
QL, KL, R, NOPE, VH, L1 = 12, 10, 4, 6, 8, 2  # MLA: q / kv lora ranks, rope / nope head dims, v head dim


def attention(prefix, layers=(L,), at=1):
    """MaxText's Attention at ``param_scan_axis`` ``at``: ``(shape, truth)`` by path."""

    def st(*s):  # insert the layer axis
        return s[:at] + layers + s[at:]

    b = (at,) if layers else ()
    sh = lambda i: tuple(a + (1 if layers and a >= at else 0) for a in i)  # noqa: E731
    out = {}
    for n, heads in (("query", N), ("key", K), ("value", K)):
        out[f"{prefix}/{n}/kernel"] = (st(D, heads, H), t(M, sh((0,)), sh((1, 2)), b))
    out[f"{prefix}/out/kernel"] = (st(N, H, D), t(M, sh((0, 1)), sh((2,)), b))
    return out


def block(prefix, layers=(L,), moe=False):
    b = (1,) if layers else ()
    st = lambda *s: s[:1] + layers + s[1:]  # noqa: E731
    sh = lambda i: tuple(a + (1 if layers and a >= 1 else 0) for a in i)  # noqa: E731
    out = attention(f"{prefix}/self_attention", layers)
    for n in ("pre_self_attention_layer_norm", "post_self_attention_layer_norm"):
        out[f"{prefix}/{n}/scale"] = (st(D), t(V, (), (0,), b))
    if moe:
        e = lambda *s: s[:1] + layers + s[1:]  # noqa: E731
        eb = (0, 1) if layers else (0,)
        out[f"{prefix}/MoeBlock_0/gate/kernel"] = (st(D, X), t(M, (0,), sh((1,)), b))
        out[f"{prefix}/MoeBlock_0/wi_0"] = (e(X, D, F), t(M, sh((1,)), sh((2,)), eb))
        out[f"{prefix}/MoeBlock_0/wi_1"] = (e(X, D, F), t(M, sh((1,)), sh((2,)), eb))
        out[f"{prefix}/MoeBlock_0/wo"] = (e(X, F, D), t(M, sh((1,)), sh((2,)), eb))
    else:
        for n, s in (("wi_0", (D, F)), ("wi_1", (D, F)), ("wo", (F, D))):
            out[f"{prefix}/mlp/{n}/kernel"] = (st(*s), t(M, (0,), sh((1,)), b))
    return out


def top(root, tied=False):
    out = {
        f"{root}token_embedder/embedding": ((VOCAB, D), t(E, (0,), (1,))),
        f"{root}decoder/decoder_norm/scale": ((D,), t(V, (), (0,))),
    }
    if not tied:
        out[f"{root}decoder/logits_dense/kernel"] = ((D, VOCAB), t(M, (0,), (1,), role="output"))
    return out


def deepseek3(root="params/"):
    out = top(root)
    for group, layers, moe in (("dense_layers", L1, False), ("moe_layers", L, True)):
        p = f"{root}decoder/{group}"
        st = lambda *s, layers=layers: s[:1] + (layers,) + s[1:]  # noqa: E731
        a = f"{p}/self_attention"
        out |= {
            f"{a}/wq_a/kernel": (st(D, QL), t(M, (0,), (2,), (1,))),
            f"{a}/q_norm/scale": (st(QL), t(V, (), (0,), (1,))),
            f"{a}/wq_b/kernel": (st(QL, N, NOPE + R), t(M, (0,), (2, 3), (1,))),
            f"{a}/wkv_a/kernel": (st(D, KL + R), t(M, (0,), (2,), (1,))),
            f"{a}/kv_norm/scale": (st(KL), t(V, (), (0,), (1,))),
            f"{a}/wkv_b/kernel": (st(KL, N, NOPE + VH), t(M, (0,), (2, 3), (1,))),
            f"{a}/out/kernel": (st(N, VH, D), t(M, (0, 2), (3,), (1,))),
        }
        for n in ("pre_self_attention_layer_norm", "post_self_attention_layer_norm"):
            out[f"{p}/{n}/scale"] = (st(D), t(V, (), (0,), (1,)))
        if not moe:
            for n, s in (("wi_0", (D, F)), ("wi_1", (D, F)), ("wo", (F, D))):
                out[f"{p}/mlp/{n}/kernel"] = (st(*s), t(M, (0,), (2,), (1,)))
            continue
        m = f"{p}/DeepSeekMoeBlock_0"
        out |= {
            f"{m}/MoeBlock_0/gate/kernel": (st(D, X), t(M, (0,), (2,), (1,))),
            f"{m}/MoeBlock_0/gate/bias": (st(X), t(V, (), (0,), (1,))),
            f"{m}/MoeBlock_0/wi_0": (st(X, D, F), t(M, (2,), (3,), (0, 1))),
            f"{m}/MoeBlock_0/wi_1": (st(X, D, F), t(M, (2,), (3,), (0, 1))),
            f"{m}/MoeBlock_0/wo": (st(X, F, D), t(M, (2,), (3,), (0, 1))),
        }
        for n, s in (("wi_0", (D, F)), ("wi_1", (D, F)), ("wo", (F, D))):
            out[f"{m}/shared_experts/{n}/kernel"] = (st(*s), t(M, (0,), (2,), (1,)))
    return out


TREES = {
    "llama2_scanned_linen": lambda: top("params/") | block("params/decoder/layers"),
    "llama2_scanned_nnx": lambda: top("") | block("decoder/layers"),
    "llama2_unscanned": lambda: (
        top("params/") | block("params/decoder/layers_0", ()) | block("params/decoder/layers_1", ())
    ),
    "llama2_tied": lambda: top("params/", tied=True) | block("params/decoder/layers"),
    "mixtral_scanned": lambda: top("params/") | block("params/decoder/layers", moe=True),
    "deepseek3_scanned": deepseek3,
}


def tree_of(spec):
    out: dict = {}
    for path, (shape, _) in spec.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jax.ShapeDtypeStruct(shape, jnp.float32)
    return out


def decide(tree, gmap=None):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        got = {p: summary(g) for p, g in (gmap or GeometryMap()).leaves(tree)}
    return got, [str(w.message) for w in rec]


def same(a, b):
    # An embedding's role routes nothing: a tied table's 'output' role is the trace's to see, not the names'.
    return a == b or (a[0] == b[0] == E and a[:5] == b[:5])


_SUGGESTION = re.compile(
    r"geometry=\{r'([^']+)': dict\(kind='matrix', fan_in_axes=(\([^)]*\)), fan_out_axes=(\([^)]*\))\)\}"
)


@pytest.mark.parametrize("name", sorted(TREES))
def test_maxtext_trees_right_or_warned_and_every_suggestion_right(name):
    spec = TREES[name]()
    truth = {p: tr for p, (_, tr) in spec.items()}
    tree = tree_of(spec)
    got, msgs = decide(tree)
    assert set(got) == set(truth)
    warned = {p: m for p in got for m in msgs if f"'{p}'" in m}
    silent = {p: (got[p], truth[p]) for p in truth if not same(got[p], truth[p]) and p not in warned}
    assert not silent, silent
    # Every warning's suggested override, applied as written, gives the truth for the leaf it names.
    for p, msg in warned.items():
        m = _SUGGESTION.search(msg)
        assert m, msg
        override = {m.group(1): dict(kind="matrix", fan_in_axes=eval(m.group(2)), fan_out_axes=eval(m.group(3)))}  # noqa: S307
        fixed, _ = decide(tree, GeometryMap(override))
        assert fixed[p][:5] == truth[p][:5], (p, fixed[p], truth[p], msg)
    if name.startswith("llama2"):
        assert not warned, warned  # Llama's every leaf has a name rule: nothing left to warn


def maxtext_dimension_numbers(spec):
    """MaxText's ``muon_weight_dimension_numbers`` for these trees (its ``muon_utils`` table: query / key /
    value ``((0,), (-2, -1))``, attention ``out`` ``((0, -2), (-1,))``, experts ``((-2,), (-1,))``, other
    kernels ``((0,), (-1,))``; ``None`` for scales, biases, the embedding and ``logits_dense``)."""
    out = {}
    for p in spec:
        if any(k in p for k in ("scale", "bias", "embedding", "logits_dense")):
            out[p] = None
        elif "MoeBlock_0" in p and any(k in p for k in ("wi_0", "wi_1", "wo")) and "shared" not in p:
            out[p] = mdn((-2,), (-1,))
        elif "self_attention" in p and "/out/" in p:
            out[p] = mdn((0, -2), (-1,))
        elif "self_attention" in p and any(k in p for k in ("query", "key", "value", "wq_b", "wkv_b")):
            out[p] = mdn((0,), (-2, -1))
        else:
            out[p] = mdn((0,), (-1,))
    return out


@pytest.mark.parametrize("name", ["llama2_scanned_linen", "mixtral_scanned", "deepseek3_scanned"])
def test_muon_dimension_numbers_are_a_geometry(name):
    spec = TREES[name]()
    truth = {p: tr for p, (_, tr) in spec.items()}
    dims = tree_of({p: ((1,), None) for p in spec})  # same structure ...
    flat = maxtext_dimension_numbers(spec)
    dims = jax.tree_util.tree_map_with_path(lambda kp, _: flat[so._geometry.path_str(kp)], dims)
    gmap = so.as_geometry_map(dims)
    got, msgs = decide(tree_of(spec), gmap)
    assert not msgs, msgs
    for p, dn in flat.items():
        if dn is not None:
            assert got[p][:4] == truth[p][:4], (p, got[p], truth[p])
            assert gmap.decided_by(p, spec[p][0]) == "dimension numbers"
        else:
            assert same(got[p], truth[p]), (p, got[p], truth[p])  # None: the other rules decide
    if name == "llama2_scanned_linen":  # the named optimizers take the tree as their geometry
        tx = so.muon(0.02, geometry=dims)
        params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), tree_of(spec))
        upd, _ = jax.jit(tx.update)(params, tx.init(params), params)
        assert jax.tree.structure(upd) == jax.tree.structure(params)


def test_dimension_numbers_that_do_not_fit_the_leaf_are_an_error_naming_it():
    with pytest.raises(so.GeometryError, match="'w'"):
        GeometryMap(tree={"w": mdn((0,), (3,))}).leaves({"w": jnp.ones((4, 5))})


def test_convlocal_kernel_on_plain_params_is_warned():
    """flax imagenet's ResNet1Local stem at size: a ConvLocal kernel (8, 8, 7 x 7 x 3, 4) under a conv name,
    no bias: a conv's and a ConvLocal's layouts give different updates, so it is warned."""
    tree = {"conv_init": {"kernel": jnp.ones((8, 8, 147, 4))}, "bn_init": {"scale": jnp.ones(4)},
            "conv_1": {"kernel": jnp.ones((3, 3, 4, 4))}, "head": {"kernel": jnp.ones((4, 10))}}  # fmt: skip
    _, msgs = decide(tree)
    assert any("'conv_init/kernel'" in m and "ConvLocal" in m for m in msgs), msgs


@pytest.mark.parametrize("head_dim", [4, 8])
def test_flax_attention_with_heads_equal_to_head_dim_is_no_layer_stack(head_dim):
    """Flax's attention on plain params: ``query/kernel (D, heads, head_dim)`` beside ``query/bias (heads,
    head_dim)``. With ``heads == head_dim`` the two share a size on axis 1, which is no layer axis (the size
    stands on another axis too): the leaves are decided as with ``heads != head_dim``, no batch axis."""
    D, N = 16, 4
    proj = lambda: {"kernel": jnp.zeros((D, N, head_dim)), "bias": jnp.zeros((N, head_dim))}
    tree = {"attn": {"query": proj(), "key": proj(), "value": proj(),
                     "out": {"kernel": jnp.zeros((N, head_dim, D)), "bias": jnp.zeros((D,))}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", so.GeometryWarning)
        got = {p: summary(g) for p, g in GeometryMap().leaves(tree)}
    assert got["attn/query/kernel"][1:4] == ((0,), (1, 2), ()), got["attn/query/kernel"]
    assert got["attn/query/bias"][3] == (), got["attn/query/bias"]
    assert got["attn/out/kernel"][1:4] == ((0, 1), (2,), ()), got["attn/out/kernel"]
