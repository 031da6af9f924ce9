"""Geometry on the models people train today (issue 34): rotary embeddings, scanned encoders that
emit per-layer outputs, learned tokens, ConvLocal from plain params, mixture-of-experts.

The fixtures (``_modern_fixtures``) are written in the styles of public Flax code. Every leaf is
checked against a truth table written here by hand from the model code; one Muon step on the
traced geometry equals the step on the hand-written geometry; for the experts, each expert's step
equals the step of Muon on that expert's ``(d_in, d_out)`` matrix alone (an independent matrix).
"""

import warnings

import _modern_fixtures as F
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _nn_reference import randomize
from flax import nnx
from test_trace_geometry import (
    E,
    M,
    V,
    check_muon_matches_truth,
    check_plain,
    check_truth,
    muon_step,
    nnx_gemma_truth,
    summary,
    t,
)

import spectral_optax as so
from spectral_optax import Geometry, GeometryMap

TOKENS = jnp.zeros((2, 8), jnp.int32)
IMAGE = jnp.ones((2, 8, 8, 3))


def init(model, x):
    return model.init(jax.random.key(0), x)["params"]


# ================================================================ rotary embeddings
def gemma_rope_truth(fused=False, layers=2):
    truth = {"input_embedding": t(E, (0,), (1,), role="output"), "final_norm/scale": t(V, (), (0,))}
    for i in range(layers):
        b = f"layer_{i}"
        if fused:  # (3, N, D, H) 'BTD,SNDH->SBTNH': q, k, v stacked on axis 0, each (D, N H)
            truth[f"{b}_attn/qkv_einsum/w"] = t(M, (2,), (1, 3), (0,))
        else:
            truth[f"{b}_attn/q_einsum/w"] = t(M, (1,), (0, 2))  # (N, D, H): the head dim cut by RoPE, re-joined
            truth[f"{b}_attn/kv_einsum/w"] = t(M, (2,), (1, 3), (0,))  # (2, K, D, H): k / v stacked
        truth |= {
            f"{b}_attn/attn_vec_einsum/w": t(M, (0, 1), (2,)),
            f"{b}_gating_einsum": t(M, (1,), (2,), (0,)),  # (2, D, F): gate / up used separately
            f"{b}_linear": t(M, (0,), (1,)),
            f"{b}_pre_attention_norm/scale": t(V, (), (0,)),
            f"{b}_pre_ffw_norm/scale": t(V, (), (0,)),
        }
    return truth


def dense_heads_truth():
    truth = {"tok_embeddings/embedding": t(E, (0,), (1,)), "norm/scale": t(V, (), (0,)),
             "output/kernel": t(M, (0,), (1,), role="output")}  # fmt: skip
    for i in range(2):
        truth[f"attention_norm_{i}/scale"] = t(V, (), (0,))
        truth |= {f"w{n}_{i}/kernel": t(M, (0,), (1, 2)) for n in "qkv"}  # (D, N, H): heads x head dim fan-out
        truth[f"wo_{i}/kernel"] = t(M, (0, 1), (2,))
    return truth


@pytest.mark.slow  # Linen inits, traces and Muon steps of two 2-layer decoders, ~13 s
@pytest.mark.parametrize("fused", [False, True])
def test_gemma_rope_halves_linen(fused):
    model = F.GemmaRope(fused=fused)
    params = init(model, TOKENS)
    truth = gemma_rope_truth(fused)
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_truth(params, gmap, truth)
    check_muon_matches_truth(params, gmap, truth)


@pytest.mark.slow  # Linen init, two traces and a Muon step each, ~7 s
@pytest.mark.parametrize("style", ["pairs", "complex"])
def test_interleaved_and_complex_rope_dense_heads(style):
    model = F.DenseHeadsRope(style=style)
    params = init(model, TOKENS)
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_truth(params, gmap, dense_heads_truth())
    # The same decisions from a trace of apply (the walk of the forward pass alone).
    check_truth(params, GeometryMap.from_apply(lambda p, x: model.apply({"params": p}, x), params, TOKENS),
                dense_heads_truth())  # fmt: skip
    check_muon_matches_truth(params, gmap, dense_heads_truth())


def test_rope_cut_of_the_head_dim_is_not_a_fused_split_but_q_k_v_blocks_are():
    """A cut re-joined before the next weight is followed through; blocks that reach different
    consumers (a fused projection split into q / k / v, then roped) are still a fused split."""
    d, heads, hd = 24, 2, 4
    positions = jnp.zeros((2, 8))

    def apply(p, x):
        q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)  # (B, T, 3 N H) fused, then q / k / v
        q, k, v = (y.reshape(2, 8, heads, hd) for y in (q, k, v))
        a = F.attend(F.rope_halves(q, positions), F.rope_pairs(k, positions), v)
        return a.reshape(2, 8, heads * hd) @ p["out"]

    params = {"qkv": jnp.zeros((d, 3 * heads * hd)), "out": jnp.zeros((heads * hd, d))}
    gmap = GeometryMap.from_apply(apply, params, jnp.zeros((2, 8, d)))
    check_truth(params, gmap, {"qkv": t(M, (0,), (1,), splits=3), "out": t(M, (0,), (1,), role="output")})

    def partial_rope(p, x):  # rotary on half the head dim (unequal blocks), the rest passed through
        q = jnp.einsum("btd,dnh->btnh", x, p["q"])
        q = jnp.concatenate([F.rope_halves(q[..., :2], positions), q[..., 2:6]], axis=-1)
        return jnp.einsum("btnh,nhd->btd", q, p["o"])

    params = {"q": jnp.zeros((d, heads, 6)), "o": jnp.zeros((heads, 6, d))}
    gmap = GeometryMap.from_apply(partial_rope, params, jnp.zeros((2, 8, d)))
    check_truth(params, gmap, {"q": t(M, (0,), (1, 2)), "o": t(M, (0, 1), (2,), role="output")})


def test_nnx_gemma_rope_and_the_hint_never_merges_k_and_v_silently():
    model = F.NNXGemmaRope(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    truth = nnx_gemma_truth(mlp=False)
    gmap = GeometryMap.from_nnx(model, TOKENS, jnp.zeros((2, 8)))
    check_truth(state, gmap, truth)
    check_muon_matches_truth(state, gmap, truth)

    # Where the trace gives up on an nnx.Einsum whose output axes may be a stack, the module hint
    # decides only with a warning naming the path and the reason.
    class KVStrided(nnx.Module):
        def __init__(self, rngs):
            self.kv_einsum = nnx.Einsum("BSD,CKDH->CBSKH", (2, 2, 8, 4), rngs=rngs)

        def __call__(self, x):
            k, v = self.kv_einsum(x)
            return k[..., ::2].sum() + v.sum()  # a strided cut: no Geometry expresses it

    m = KVStrided(nnx.Rngs(0))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        g = GeometryMap.from_nnx(m, jnp.zeros((2, 3, 8)))
        g.leaves(nnx.state(m, nnx.Param))
    msgs = [str(w.message) for w in rec]
    assert any("'kv_einsum/kernel'" in s and "could not decide" in s and "override" in s for s in msgs), msgs
    assert g.decided_by("kv_einsum/kernel", (2, 2, 8, 4)).startswith("module hint (warned; trace:")


# ================================================================ scanned encoder, learned tokens
def vit_truth():
    L = (0,)  # the scanned layer axis of the stacked block: a batch axis
    truth = {
        "embedding/kernel": t(M, (0, 1, 2), (3,)),  # (p, p, 3, D) patch conv
        "embedding/bias": t(V, (), (0,)),
        "cls": t(V, (), (2,), (0, 1)),  # (1, 1, D) tiled and concatenated: a constant input of width 1
        "pos_embedding": t(E, (1,), (2,), (0,)),  # (1, N, D) added at every position: a table of tokens
        "encoder_norm/scale": t(V, (), (0,)),
        "encoder_norm/bias": t(V, (), (0,)),
        "head/kernel": t(M, (0,), (1,), role="output"),
        "head/bias": t(V, (), (0,), role="output"),
        "MAPHead_0/probe": t(V, (), (2,), (0, 1)),  # (1, 1, D) tiled over the batch, the query's input
        "MAPHead_0/LayerNorm_0/scale": t(V, (), (0,)),
        "MAPHead_0/LayerNorm_0/bias": t(V, (), (0,)),
    }
    for n in ("Dense_0", "Dense_1"):
        truth[f"MAPHead_0/MlpBlock_0/{n}/kernel"] = t(M, (0,), (1,))
        truth[f"MAPHead_0/MlpBlock_0/{n}/bias"] = t(V, (), (0,))
        truth[f"encoderblock/MlpBlock_0/{n}/kernel"] = t(M, (1,), (2,), L)
        truth[f"encoderblock/MlpBlock_0/{n}/bias"] = t(V, (), (1,), L)
    for m, b in {
        "MAPHead_0/MultiHeadDotProductAttention_0": (),
        "encoderblock/MultiHeadDotProductAttention_0": L,
    }.items():
        o = len(b)
        for n in ("query", "key", "value"):  # (D, N, H) heads
            truth[f"{m}/{n}/kernel"] = t(M, (o,), (o + 1, o + 2), b)
            truth[f"{m}/{n}/bias"] = t(V, (), (o, o + 1), b)
        truth[f"{m}/out/kernel"] = t(M, (o, o + 1), (o + 2,), b)
        truth[f"{m}/out/bias"] = t(V, (), (o,), b)
    for n in ("LayerNorm_0", "LayerNorm_1"):
        truth |= {f"encoderblock/{n}/{k}": t(V, (), (1,), L) for k in ("scale", "bias")}
    return truth


@pytest.mark.slow  # a Linen ViT init + trace + two Muon steps, ~12 s
def test_scanned_vit_per_layer_outputs_carry_no_role_and_learned_tokens():
    model = F.ScanViT()
    params = init(model, IMAGE)
    truth = vit_truth()
    gmap = GeometryMap.from_linen(model, IMAGE)
    check_truth(params, gmap, truth)
    check_muon_matches_truth(params, gmap, truth)
    # init_with_geometry: the same decisions, and the variables of jax.jit(model.init).
    variables, g1 = so.init_with_geometry(model, jax.random.key(0), IMAGE)
    check_truth(variables["params"], g1, truth)
    assert g1.decided_by("MAPHead_0/probe", (1, 1, 16)).startswith("trace: a learned token")


@pytest.mark.slow  # ~5 s
def test_nnx_scan_body_returning_per_layer_outputs():
    model = F.NNXScanEncoder(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    B = (0,)
    truth = {
        "stem/kernel": t(M, (0,), (1,)),
        "stem/bias": t(V, (), (0,)),
        "classifier/kernel": t(M, (0,), (1,), role="output"),
        "classifier/bias": t(V, (), (0,), role="output"),
    }
    truth |= {f"blocks/norm/{k}": t(V, (), (1,), B) for k in ("scale", "bias")}
    truth |= {f"blocks/{n}/kernel": t(M, (1,), (2,), B) for n in ("fc1", "fc2")}
    truth |= {f"blocks/{n}/bias": t(V, (), (1,), B) for n in ("fc1", "fc2")}
    gmap = GeometryMap.from_nnx(model, jnp.ones((2, 4, 8)))
    check_truth(state, gmap, truth)
    check_muon_matches_truth(state, gmap, truth)


def test_linen_scan_remat_vmap_cond_bodies_dropping_per_layer_outputs():
    """The read-out is what reaches the returned value, through nn.scan(nn.remat) / nn.vmap / nn.cond
    bodies whose extra outputs the model drops."""

    class Body(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            y = nn.Dense(8, name="fc")(x)
            return jax.nn.gelu(y), nn.Dense(3, name="aux")(y)  # aux: a per-layer output, dropped

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            scan = nn.scan(nn.remat(Body), variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
            x, _ = scan(name="layers")(x, None)
            vm = nn.vmap(Body, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=(0, None))
            x, _ = vm(name="ensemble")(jnp.stack([x, x]), None)
            x = x.mean(0)
            x = nn.cond(True, lambda m, x: m(x), lambda m, x: m(x) * 2, nn.Dense(8, name="branch"), x)
            return nn.Dense(4, name="readout")(x)

    x = jnp.ones((2, 8))
    model = Net()
    params = init(model, x)
    S = (0,)
    truth = {f"{m}/{n}/kernel": t(M, (1,), (2,), S) for m in ("layers", "ensemble") for n in ("fc", "aux")}
    truth |= {f"{m}/{n}/bias": t(V, (), (1,), S) for m in ("layers", "ensemble") for n in ("fc", "aux")}
    truth |= {"branch/kernel": t(M, (0,), (1,)), "branch/bias": t(V, (), (0,)),
              "readout/kernel": t(M, (0,), (1,), role="output"), "readout/bias": t(V, (), (0,), role="output")}  # fmt: skip
    check_truth(params, GeometryMap.from_linen(model, x), truth)


def test_while_loop_carry_the_model_drops_carries_no_role():
    def apply(p, x):
        def body(c):
            i, h, _ = c
            h = jnp.tanh(h @ p["w"])
            return i + 1, h, h @ p["aux"]  # a per-step output carried and dropped

        _, h, _ = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x, jnp.zeros((2, 3))))
        return h @ p["head"]

    params = {"w": jnp.zeros((6, 6)), "aux": jnp.zeros((6, 3)), "head": jnp.zeros((6, 2))}
    gmap = GeometryMap.from_apply(apply, params, jnp.zeros((2, 6)))
    check_truth(params, gmap, {"w": t(M, (0,), (1,)), "aux": t(M, (0,), (1,)), "head": t(M, (0,), (1,), role="output")})


def test_register_tokens_are_a_table_and_a_scalar_gate_a_vector():
    """Register tokens ``(1, R, D)`` tiled and concatenated: R learned inputs, each read by its own one-hot
    index (an embedding over R); a class token ``(1, 1, D)``: a vector; a learned scalar gate broadcast over
    the activations: a vector."""

    def apply(p, x):
        n = x.shape[0]
        tokens = [jnp.tile(p["cls"], (n, 1, 1)), jnp.tile(p["registers"], (n, 1, 1)), x @ p["w"]]
        h = jnp.concatenate(tokens, axis=1) * p["gate"]
        return h[:, 0] @ p["head"]

    params = {"cls": jnp.zeros((1, 1, 8)), "registers": jnp.zeros((1, 4, 8)), "w": jnp.zeros((6, 8)),
              "gate": jnp.zeros(()), "head": jnp.zeros((8, 3))}  # fmt: skip
    gmap = GeometryMap.from_apply(apply, params, jnp.zeros((2, 5, 6)))
    check_truth(params, gmap, {"cls": t(V, (), (2,), (0, 1)), "registers": t(E, (1,), (2,), (0,)),
                               "w": t(M, (0,), (1,)), "gate": t(V), "head": t(M, (0,), (1,), role="output")})  # fmt: skip


# ================================================================ ConvLocal from plain params
def test_convlocal_under_a_neutral_name_traced_and_warned_from_plain_params():
    model = F.ResNet1Local()
    variables = model.init(jax.random.key(0), IMAGE)
    params = variables["params"]
    truth = {
        "conv_init/kernel": t(M, (2,), (3,), (0, 1)),  # (H', W', 3 x 3 x 3, out): one matrix per position
        "bn_init/scale": t(V, (), (0,)),
        "bn_init/bias": t(V, (), (0,)),
        "conv_1/kernel": t(M, (0, 1, 2), (3,)),  # (3, 3, in, out) conv
        "head/kernel": t(M, (0,), (1,), role="output"),
        "head/bias": t(V, (), (0,), role="output"),
    }
    check_truth(params, GeometryMap.from_linen(model, IMAGE), truth)
    silent, warned = check_plain(params, truth)
    assert not silent, silent
    assert warned == {"conv_init/kernel"}  # conv_1's input width is conv_init's output width: a conv
    # With a bias the shapes decide: (positions..., out) is a local conv's, (out,) a conv's.
    shapes = {"conv_init/kernel": (8, 8, 27, 4), "conv_init/bias": (8, 8, 4), "c2/conv/kernel": (3, 3, 4, 4),
              "c2/conv/bias": (4,)}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", so.GeometryWarning)
        got = dict(GeometryMap().leaves({k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}))
    assert summary(got["conv_init/kernel"])[:4] == (M, (2,), (3,), (0, 1))
    assert summary(got["c2/conv/kernel"])[:4] == (M, (0, 1, 2), (3,), ())


@pytest.mark.slow  # four package models, ~10 s
def test_plain_params_of_the_package_models_add_no_warning():
    L = so.nn.linen
    models = [
        (L.Transformer(vocab_size=32, features=16, num_blocks=2, num_heads=2, max_len=8), TOKENS),
        (L.Transformer(vocab_size=32, features=16, num_blocks=2, num_heads=2, max_len=8, scan=False, qkv="fused"),
         TOKENS),
        (L.ResNet(features=8, num_blocks=2, num_classes=3), IMAGE),
    ]  # fmt: skip
    trees = [init(m, x) for m, x in models]
    trees.append(nnx.state(so.nn.nnx.Transformer(32, 16, 2, 2, max_len=8, qkv="fused", rngs=nnx.Rngs(0)), nnx.Param))
    for tree in trees:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always", so.GeometryWarning)
            GeometryMap().leaves(tree)
        assert not [str(w.message) for w in rec if "ConvLocal" in str(w.message)]


# ================================================================ mixture of experts
def moe_truth():
    L = (0,)  # nn.scan's layer axis
    return {
        "embed/embedding": t(E, (0,), (1,)),
        "blocks/norm/scale": t(V, (), (1,), L),
        "blocks/norm/bias": t(V, (), (1,), L),
        "blocks/moe/router": t(M, (1,), (2,), L),  # (L, D, E): a hidden matrix D -> E
        "blocks/moe/wi": t(M, (2,), (3,), (0, 1)),  # (L, E, D, F): one (D, F) matrix per layer and expert
        "blocks/moe/wo": t(M, (2,), (3,), (0, 1)),  # (L, E, F, D)
        "blocks/moe/shared_in/kernel": t(M, (1,), (2,), L),
        "blocks/moe/shared_out/kernel": t(M, (1,), (2,), L),
        "lm_head/kernel": t(M, (0,), (1,), role="output"),
        "lm_head/bias": t(V, (), (0,), role="output"),
    }


def check_experts_independent(params, gmap):
    """Each expert's Muon step equals Muon's step on that expert's matrix alone."""
    got = muon_step(params, gmap)
    grads = randomize(params, seed=5, scale=1.0)  # the gradients muon_step uses
    for name in ("wi", "wo"):
        w, g, u = (np.asarray(tree["blocks"]["moe"][name]) for tree in (params, grads, got))
        for layer, expert in [(0, 0), (1, 3)]:
            tx = so.muon(0.1, geometry=GeometryMap(tree={"w": Geometry.matrix(w.shape[2:])}))
            p1 = {"w": jnp.asarray(w[layer, expert])}
            ref, _ = tx.update({"w": jnp.asarray(g[layer, expert])}, tx.init(p1), p1)
            np.testing.assert_allclose(u[layer, expert], np.asarray(ref["w"]), rtol=2e-5, atol=1e-7, err_msg=name)


@pytest.mark.slow  # init, trace, and six Muon steps each, ~10 s
@pytest.mark.parametrize("how", ["einsum", "ragged", "gather"])
def test_moe_experts_router_shared_expert_under_scan(how):
    model = F.MoELM(how=how)
    params = init(model, TOKENS)
    truth = moe_truth()
    gmap = GeometryMap.from_linen(model, TOKENS)
    check_truth(params, gmap, truth)
    check_muon_matches_truth(params, gmap, truth)
    check_experts_independent(params, gmap)


def test_gathered_rows_contracted_with_an_activation_stay_a_table():
    """Rows of a table gathered and contracted over the table's only free axis (a sampled softmax) are
    looked-up vectors, not expert matrices: the table stays an embedding."""

    def apply(p, tok, neg):
        return jnp.einsum("bd,bkd->bk", p["emb"][tok] @ p["w"], p["emb"][neg])

    params = {"emb": jnp.zeros((20, 8)), "w": jnp.zeros((8, 8))}
    gmap = GeometryMap.from_apply(apply, params, jnp.zeros((2,), jnp.int32), jnp.zeros((2, 5), jnp.int32))
    assert summary(gmap.tree(params)["emb"]) == t(E, (0,), (1,))


@pytest.mark.slow  # a subprocess on 64 host devices: trace, plan and compile (no run), ~10 s
def test_moe_pod_plan_at_64_devices_compile_only():
    """The geometry the trace gives a ragged_dot MoE (2 layers x 64 experts of 128 x 256, the expert
    axis sharded over 64 devices), planned and compiled on abstract inputs: each expert one matrix in
    the plan (260 matrices of 128 x 256: 2 x 2 x 64 experts and the 4 shared-expert kernels; read with the
    expert axis in the fan-out they would be 4 matrices of 128 x 16384), the compiled flops within 5% of
    the plan's, no device holding the expert stacks (temp below half their 33.5 MB; measured 8.5 MB), and
    the experts orthogonalized where they are (collectives 1.4 MB, under the plan's predicted 1.2 MiB plus
    the replicated router's and head's updates gathered back whole, 0.33 MB, all-gathers counted by what a
    device receives; 7.3 MB when the group was dealt by stack position: docs/lab_log.md, 2026-12-04)."""
    from tests.test_sharding import run_script

    out = run_script(
        """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import spectral_optax as so
from spectral_optax.lab.cli import collective_bytes
from tests._modern_fixtures import MoELM

L, E, D, F = 2, 64, 128, 256
mesh = jax.make_mesh((64,), ("data",))
model = MoELM(vocab=512, d=D, layers=L, how="ragged", experts=E, hidden=F)
tokens = jax.ShapeDtypeStruct((8, 16), jnp.int32)
gmap = so.GeometryMap.from_linen(model, tokens)
shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
expert = lambda p: any(k in jax.tree_util.keystr(p) for k in ("'wi'", "'wo'"))
grads = jax.tree_util.tree_map_with_path(lambda p, x: jax.ShapeDtypeStruct(
    x.shape, x.dtype, sharding=NamedSharding(mesh, P(None, "data") if expert(p) else P())), shapes)
tx = so.orthogonalize_via_newton_schulz(geometry=gmap, ns_method="standard", scale=1.0)
plan = so.expert.orthogonalization_plan(grads, geometry=gmap, ns_method="standard")
print(plan)
counts = {(g.m, g.n): g.count for g in plan.groups}
assert counts.get((128, 256)) == 2 * L * E + 4, counts
with jax.set_mesh(mesh):
    compiled = jax.jit(tx.update).lower(grads, jax.eval_shape(tx.init, grads)).compile()
flops = compiled.cost_analysis()["flops"]
temp = compiled.memory_analysis().temp_size_in_bytes
coll = collective_bytes(compiled.as_text())
comm = sum(coll.values())
print("flops", flops, "plan", plan.flops_per_device, "temp", temp, "comm", comm, "plan bytes", plan.bytes_per_device)
assert plan.flops_per_device <= flops <= 1.05 * plan.flops_per_device, (flops, plan.flops_per_device)
assert temp < 0.5 * 2 * L * E * D * F * 4, temp
# the plan prices moves as if every leaf were sharded; the replicated router and head, split over
# devices, get their updates back whole by an all-gather (each device receives the whole matrix)
gathered = sum(g.count * g.m * g.n * 4 for g in plan.groups if g.split > 1)
assert comm <= plan.bytes_per_device + gathered, (comm, plan.bytes_per_device, gathered, coll)
print("ok")
""",
        devices=64,
    )
    assert "ok" in out, out


@pytest.mark.parametrize("name", ["wpe", "learned_positions"])
def test_position_table_added_to_the_activations_is_an_embedding(name):
    """A learned position table ``(T, D)`` added to the token embeddings (GPT-2's ``wpe`` written as
    ``self.param`` + add; ViT's ``(1, N, D)`` table the same way): fed the one-hot position, so an
    embedding with input width T (docs/math.md), decided by the trace under any name (a neutral
    name used to fall to the name rule, which read it as a matrix)."""
    import flax.linen as nn

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(64, 32, name="wte")(tokens)
            pos = self.param(name, nn.initializers.normal(0.02), (16, 32))
            vit = self.param("tokens_pos", nn.initializers.normal(0.02), (1, 16, 32))
            x = x + pos[None, : tokens.shape[1]] + vit
            x = nn.Dense(32, name="fc")(x)
            return nn.Dense(64, name="head")(x)

    gmap = so.GeometryMap.from_linen(Decoder(), jnp.zeros((2, 16), jnp.int32))
    got = {p: gmap.resolve([p], [s])[0] for p, s in ((name, (16, 32)), ("tokens_pos", (1, 16, 32)))}
    for path, g in got.items():
        assert (g.kind, g.role, g.d_in, g.d_out) == ("embedding", "hidden", 16, 32), (path, g)
    fc = gmap.resolve(["fc/kernel"], [(32, 32)])[0]
    assert (fc.kind, fc.d_in, fc.d_out) == ("matrix", 32, 32), fc
