"""qk_clip, the logit recording and qk_logit_bound against float64 NumPy references."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spectral_optax as so

warnings.filterwarnings("ignore", category=so.GeometryWarning)

D, N, H = 16, 4, 4


def _logits(x, wq, wk, bq=None, bk=None):
    """float64 reference: per-head max |q.k| / sqrt(d_h); wq (D, N, H), wk (D, K, H)."""
    x, wq, wk = (np.asarray(a, np.float64) for a in (x, wq, wk))
    q = np.einsum("td,dnh->tnh", x, wq) + (0 if bq is None else np.asarray(bq, np.float64))
    k = np.einsum("td,dkh->tkh", x, wk) + (0 if bk is None else np.asarray(bk, np.float64))
    k = np.repeat(k, wq.shape[1] // wk.shape[1], axis=1)
    return np.abs(np.einsum("tnh,snh->nts", q, k)).max(axis=(1, 2)) / np.sqrt(wq.shape[-1])


def _rand(key, *shape, scale=1.0):
    return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


def _clip(params, updates, logits, tau, **kw):
    t = so.qk_clip(tau, **kw)
    out, state = jax.jit(t.update)(updates, t.init(params), params, max_logits=logits)
    assert isinstance(state, optax.EmptyState)
    return out


def _expected(p, u, logits, tau):
    """new = sqrt(gamma) (p + u) per head, gamma = min(1, tau / S)."""
    g = np.minimum(1.0, tau / np.asarray(logits, np.float64))
    return (np.asarray(p, np.float64) + np.asarray(u, np.float64)) * np.sqrt(g)[None, :, None]


def test_mha_dense_general_per_head_scaling_and_untouched_heads():
    x = _rand(0, 8, D)
    p = {
        "attn": {
            "query": {"kernel": _rand(1, D, N, H)},
            "key": {"kernel": _rand(2, D, N, H)},
            "value": {"kernel": _rand(3, D, N, H)},
        }
    }
    u = jax.tree.map(lambda a: 0.01 * jnp.ones_like(a), p)
    s = _logits(x, p["attn"]["query"]["kernel"], p["attn"]["key"]["kernel"])
    tau = float(np.sort(s)[1] + 1e-3)  # two heads under, two over
    out = _clip(p, u, {"attn": jnp.asarray(s, jnp.float32)}, tau)
    for name in ("query", "key"):
        new = np.asarray(p["attn"][name]["kernel"] + out["attn"][name]["kernel"], np.float64)
        np.testing.assert_allclose(
            new, _expected(p["attn"][name]["kernel"], u["attn"][name]["kernel"], s, tau), rtol=2e-5, atol=2e-6
        )
        under = s <= tau
        assert np.array_equal(
            np.asarray(out["attn"][name]["kernel"])[:, under], np.asarray(u["attn"][name]["kernel"])[:, under]
        )
    assert out["attn"]["value"]["kernel"] is u["attn"]["value"]["kernel"] or np.array_equal(
        out["attn"]["value"]["kernel"], u["attn"]["value"]["kernel"]
    )


def test_clipped_logits_recomputed_are_at_most_tau_with_biases():
    x = _rand(0, 8, D)
    p = {
        "attn": {
            "query": {"kernel": _rand(1, D, N, H), "bias": _rand(4, N, H)},
            "key": {"kernel": _rand(2, D, N, H), "bias": _rand(5, N, H)},
        }
    }
    zero = jax.tree.map(jnp.zeros_like, p)
    a = p["attn"]
    s = _logits(x, a["query"]["kernel"], a["key"]["kernel"], a["query"]["bias"], a["key"]["bias"])
    tau = float(s.min() * 0.5)
    new = optax.apply_updates(p, _clip(p, zero, {"attn": jnp.asarray(s, jnp.float32)}, tau))
    b = new["attn"]
    s2 = _logits(x, b["query"]["kernel"], b["key"]["kernel"], b["query"]["bias"], b["key"]["bias"])
    assert np.all(s2 <= tau * (1 + 1e-5))
    np.testing.assert_allclose(s2, tau, rtol=1e-5)  # every head was over: now exactly at tau


def test_gqa_key_head_takes_the_group_max():
    k_heads = 2
    x = _rand(0, 8, D)
    p = {"attn": {"query": {"kernel": _rand(1, D, N, H)}, "key": {"kernel": _rand(2, D, k_heads, H)}}}
    zero = jax.tree.map(jnp.zeros_like, p)
    s = np.array([1.0, 5.0, 2.0, 0.5])  # groups (0, 1) and (2, 3)
    tau = 2.5
    out = _clip(p, zero, {"attn": jnp.asarray(s, jnp.float32)}, tau)
    g = np.minimum(1, tau / s)
    gk = np.array([g[:2].min(), g[2:].min()])
    new_q = np.asarray(p["attn"]["query"]["kernel"] + out["attn"]["query"]["kernel"])
    new_k = np.asarray(p["attn"]["key"]["kernel"] + out["attn"]["key"]["kernel"])
    np.testing.assert_allclose(new_q, np.asarray(p["attn"]["query"]["kernel"]) * np.sqrt(g)[None, :, None], rtol=1e-6)
    np.testing.assert_allclose(new_k, np.asarray(p["attn"]["key"]["kernel"]) * np.sqrt(gk)[None, :, None], rtol=1e-6)
    # and the recomputed logits of the real batch stay under tau where they were measured
    s_real = _logits(x, p["attn"]["query"]["kernel"], p["attn"]["key"]["kernel"])
    new = optax.apply_updates(p, _clip(p, zero, {"attn": jnp.asarray(s_real, jnp.float32)}, float(s_real.min())))
    s2 = _logits(x, new["attn"]["query"]["kernel"], new["attn"]["key"]["kernel"])
    assert np.all(s2 <= s_real.min() * (1 + 1e-5))


def test_fused_c_attn_with_layer_stack():
    layers = 2
    w = _rand(1, layers, D, 3 * D)  # (L, D, 3D): q | k | v blocks, heads of width H
    b = _rand(2, layers, 3 * D)
    p = {"h": {"attn": {"c_attn": {"kernel": w, "bias": b}}}}
    zero = jax.tree.map(jnp.zeros_like, p)
    s = np.array([[1.0, 9.0, 3.0, 0.1], [4.0, 4.0, 4.0, 4.0]])
    tau = 2.0
    out = _clip(p, zero, {"h/attn": jnp.asarray(s, jnp.float32)}, tau)
    g = np.sqrt(np.minimum(1, tau / s))  # (L, N)
    f = np.ones((layers, 3, N))
    f[:, 0], f[:, 1] = g, g
    f = np.repeat(f, H, axis=-1).reshape(layers, 3 * D)
    new = optax.apply_updates(p, out)["h"]["attn"]["c_attn"]
    np.testing.assert_allclose(new["kernel"], np.asarray(w) * f[:, None, :], rtol=1e-6)
    np.testing.assert_allclose(new["bias"], np.asarray(b) * f, rtol=1e-6)


def test_gemma_qkv_einsum_and_einsum_heads():
    w = _rand(1, 3, N, D, H)  # 'BTD,SNDH->SBTNH'
    p = {"layer_0": {"attn": {"qkv_einsum": {"w": w}}}}
    zero = jax.tree.map(jnp.zeros_like, p)
    s = np.array([0.5, 3.0, 8.0, 1.0])
    out = _clip(p, zero, {"layer_0": {"attn": {"max_logits": jnp.asarray(s, jnp.float32)}}}, 2.0)
    g = np.sqrt(np.minimum(1, 2.0 / s))
    exp = np.array(w, np.float64)
    exp[0] *= g[:, None, None]
    exp[1] *= g[:, None, None]
    np.testing.assert_allclose(optax.apply_updates(p, out)["layer_0"]["attn"]["qkv_einsum"]["w"], exp, rtol=1e-6)
    # q_einsum (N, D, H) + kv_einsum (2, K, D, H), GQA with K = 2
    p2 = {"attn": {"q_einsum": {"w": _rand(2, N, D, H)}, "kv_einsum": {"w": _rand(3, 2, 2, D, H)}}}
    z2 = jax.tree.map(jnp.zeros_like, p2)
    out2 = optax.apply_updates(p2, _clip(p2, z2, {"attn": jnp.asarray(s, jnp.float32)}, 2.0))
    gk = np.array([g[:2].min(), g[2:].min()])
    np.testing.assert_allclose(
        out2["attn"]["q_einsum"]["w"], np.asarray(p2["attn"]["q_einsum"]["w"]) * g[:, None, None], rtol=1e-6
    )
    kv = np.array(p2["attn"]["kv_einsum"]["w"], np.float64)
    kv[0] *= gk[:, None, None]
    np.testing.assert_allclose(out2["attn"]["kv_einsum"]["w"], kv, rtol=1e-6)


def test_bound_against_svd_and_bound_source_clips_to_tau():
    layers, k_heads = 2, 2
    p = {
        "blocks": {
            "attn": {"query": {"kernel": _rand(1, layers, D, N, H)}, "key": {"kernel": _rand(2, layers, D, k_heads, H)}}
        }
    }
    bound = np.asarray(so.diagnostics.qk_logit_bound(p)["blocks/attn"])
    wq = np.asarray(p["blocks"]["attn"]["query"]["kernel"], np.float64)
    wk = np.asarray(p["blocks"]["attn"]["key"]["kernel"], np.float64)
    ref = np.array(
        [
            [np.linalg.svd(wq[l, :, h] @ wk[l, :, h // 2].T, compute_uv=False)[0] * D / np.sqrt(H) for h in range(N)]
            for l in range(layers)
        ]
    )
    np.testing.assert_allclose(bound, ref, rtol=1e-4)
    # the bound really bounds the logits of RMS-1 inputs
    x = _rand(7, 32, D)
    x = x / jnp.sqrt(jnp.mean(x**2, -1, keepdims=True))
    assert np.all(_logits(x, wq[0], wk[0]) <= ref[0] * (1 + 1e-6))
    tau = float(ref.min())
    t = so.qk_clip(tau, source="bound")
    zero = jax.tree.map(jnp.zeros_like, p)
    new = optax.apply_updates(p, t.update(zero, t.init(p), p)[0])
    assert np.all(np.asarray(so.diagnostics.qk_logit_bound(new)["blocks/attn"]) <= tau * (1 + 1e-4))


@pytest.mark.parametrize("qkv", [pytest.param("split", marks=pytest.mark.slow), "fused"])
def test_chain_after_muon_under_jit_on_the_package_gpt(qkv):
    model = so.nn.linen.Transformer(
        vocab_size=17, features=32, num_blocks=2, num_heads=2, max_len=8, qkv=qkv, record_max_logits=True
    )
    x = jnp.arange(16).reshape(2, 8) % 17
    params = model.init(jax.random.key(0), x)["params"]
    geom = so.GeometryMap.from_linen(model, x)
    opt = optax.chain(so.muon(0.02, geometry=geom), so.qk_clip(0.5, geometry=geom))
    ref_opt = so.muon(0.02, geometry=geom)

    def loss(p):
        y, inter = model.apply({"params": p}, x, mutable=["intermediates"])
        return jnp.mean(y**2), so.collect_max_logits(inter)

    (_, ml), g = jax.value_and_grad(loss, has_aux=True)(params)
    assert ml["blocks/attn"].shape == (2, 2)
    u, _ = jax.jit(opt.update)(g, opt.init(params), params, max_logits=ml)
    u_ref, _ = ref_opt.update(g, ref_opt.init(params), params)
    # the new params are sqrt(gamma) times muon's new params on the query heads
    gamma = np.minimum(1, 0.5 / np.asarray(ml["blocks/attn"], np.float64))  # (L, N)
    leaf = "qkv" if qkv == "fused" else "query"
    new = np.asarray(optax.apply_updates(params, u)["blocks"]["attn"][leaf]["kernel"], np.float64)
    new_ref = np.asarray(optax.apply_updates(params, u_ref)["blocks"]["attn"][leaf]["kernel"], np.float64)
    if qkv == "fused":
        fac = np.repeat(np.sqrt(gamma), 16, axis=-1)[:, None, :]  # query block: the first 32 columns
        np.testing.assert_allclose(new[..., :32], new_ref[..., :32] * fac, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(new[..., 64:], new_ref[..., 64:])  # value block untouched
    else:
        np.testing.assert_allclose(new, new_ref * np.sqrt(gamma)[:, None, :, None], rtol=1e-4, atol=1e-6)
    # untouched leaves are muon's updates bit for bit
    assert np.array_equal(u["blocks"]["mlp"]["dense_0"]["kernel"], u_ref["blocks"]["mlp"]["dense_0"]["kernel"])


def test_recorded_max_logits_match_reference_and_off_by_default():
    x = jnp.arange(16).reshape(2, 8) % 11
    m = so.nn.linen.Transformer(vocab_size=11, features=16, num_blocks=1, num_heads=4, max_len=8, scan=False)
    v = m.init(jax.random.key(0), x)
    _, st = m.apply(v, x, mutable=["intermediates"])
    assert not jax.tree.leaves(st)  # off by default: nothing sown
    nm = so.nn.nnx.Transformer(11, 16, 1, 4, max_len=8, scan=False, rngs=nnx.Rngs(0))
    _, inter = nnx.capture(nm, nnx.Intermediate)(x)
    assert not jax.tree.leaves(inter)
    # on: the recorded value equals attention_max_logits of q, k; q, k recomputed in float64
    q, k = _rand(1, 2, 8, 4, 4), _rand(2, 2, 8, 2, 4)
    mask = np.tril(np.ones((8, 8), bool))[None, None]
    got = np.asarray(so.attention_max_logits(q, k, mask))
    qd, kd = np.asarray(q, np.float64), np.repeat(np.asarray(k, np.float64), 2, axis=2)
    s = np.abs(np.einsum("btnh,bsnh->bnts", qd, kd)) / 2.0
    np.testing.assert_allclose(got, np.where(mask, s, 0).max(axis=(0, 2, 3)), rtol=1e-5)
    mr = m.clone(record_max_logits=True)
    _, st = mr.apply(v, x, mutable=["intermediates"])
    ml = so.collect_max_logits(st)["blocks_0/attn"]
    # the sown value is the float64 max logit of the block's own q, k (LayerNorm of the embedded input)
    pa = jax.tree.map(lambda t: np.asarray(t, np.float64), v["params"])
    h = pa["embed"]["embedding"][np.asarray(x)] + pa["pos_embed"]["embedding"][np.arange(8)]
    ln = pa["blocks_0"]["ln_attn"]
    mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    y = (h - mu) / np.sqrt(var + 1e-6) * ln["scale"] + ln["bias"]
    at = pa["blocks_0"]["attn"]
    q = np.einsum("btd,dnh->btnh", y, at["query"]["kernel"]) + at["query"]["bias"]
    k = np.einsum("btd,dnh->btnh", y, at["key"]["kernel"]) + at["key"]["bias"]
    s_ref = np.where(mask, np.abs(np.einsum("btnh,bsnh->bnts", q, k)) / 2.0, 0).max(axis=(0, 2, 3))
    np.testing.assert_allclose(np.asarray(ml), s_ref, rtol=1e-4)


def test_bf16_params_keep_dtype_and_errors():
    p = {
        "attn": {
            "query": {"kernel": _rand(1, D, N, H).astype(jnp.bfloat16)},
            "key": {"kernel": _rand(2, D, N, H).astype(jnp.bfloat16)},
        }
    }
    u = jax.tree.map(jnp.zeros_like, p)
    out = _clip(p, u, {"attn": jnp.array([1.0, 5.0, 1.0, 1.0])}, 2.0)
    assert out["attn"]["query"]["kernel"].dtype == jnp.bfloat16
    q = np.asarray(out["attn"]["query"]["kernel"], np.float32)
    assert np.all(q[:, 0] == 0) and np.all(q[:, 2:] == 0) and np.any(q[:, 1] != 0)  # only head 1 clipped
    with pytest.raises(ValueError, match="max_logits"):
        so.qk_clip(1.0).update(u, optax.EmptyState(), p)
    with pytest.raises(ValueError, match="AttentionSpec"):
        so.qk_clip(1.0).update(u, optax.EmptyState(), p, max_logits={"nowhere": jnp.ones(4)})
    with pytest.raises(ValueError, match="threshold"):
        so.qk_clip(-1.0)
    fused = {"attn": {"qkv": {"kernel": _rand(1, D, 3 * D)}}}
    with pytest.raises(ValueError, match="num_heads"):
        so.diagnostics.qk_logit_bound(fused)
    assert so.diagnostics.qk_logit_bound(fused, num_heads=N)["attn"].shape == (1, N)


def test_guide_section_states_the_names_and_defaults():
    """docs/guide.md, "QK-clip": every module name it lists is found (near misses are not), the defaults it
    names hold."""
    import inspect
    import pathlib
    import re

    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    section = guide.split("## QK-clip (MuonClip)")[1].split("\n## ")[0]
    listed = section.split("found by name (")[1].split(")\nwith")[0]
    pairs = re.findall(r"`([A-Za-z_]+)`/`([A-Za-z_]+)`", listed.split("fused")[0])
    fused = re.findall(r"`([A-Za-z_]+)`", listed.split("fused")[1].split(";")[0])
    weights = re.findall(r"`([A-Za-z_]+)`", listed.split("kernel leaves")[1])
    assert ("query", "key") in pairs and "qkv" in fused and weights == ["kernel", "w"], (pairs, fused, weights)
    # every name listed is found: qk_clip scales that query kernel (heads over tau: sqrt(tau / S) = 1/2)
    logits = {"attn": jnp.full((N,), 4.0)}

    def clipped_query(p, query, w):
        return np.asarray(optax.apply_updates(p, _clip(p, jax.tree.map(jnp.zeros_like, p), logits, 1.0))["attn"][query][w])

    for w in weights:
        for q, k in pairs:
            einsum = q.endswith("einsum")  # Gemma: q (N, D, H), kv (2, K, D, H), leaves `w`; else (D, N H)
            if einsum and w != "w":
                continue
            p = {"attn": {q: {w: _rand(1, *((N, D, H) if einsum else (D, N * H)))},
                          k: {w: _rand(2, *((2, N, D, H) if einsum else (D, N * H)))}}}
            np.testing.assert_allclose(clipped_query(p, q, w), 0.5 * np.asarray(p["attn"][q][w]), rtol=1e-6)
        for f in fused:  # (D, 3D) q | k | v columns, Gemma's (3, N, D, H)
            if f.endswith("einsum") and w != "w":
                continue
            p = {"attn": {f: {w: _rand(3, *((3, N, D, H) if f.endswith("einsum") else (D, 3 * D)))}}}
            q_part = (lambda a: a[0]) if f.endswith("einsum") else (lambda a: a[:, :D])
            np.testing.assert_allclose(q_part(clipped_query(p, f, w)), 0.5 * q_part(np.asarray(p["attn"][f][w])),
                                       rtol=1e-6)
    # The converse (no name found beyond the list) has no public probe short of guessing names: a few near
    # misses are not found (the clip refuses logits it cannot place).
    for q, k in (("query_proj", "key_proj"), ("Wq", "Wk"), ("to_q", "to_k")):
        p = {"attn": {q: {"kernel": _rand(1, D, N * H)}, k: {"kernel": _rand(2, D, N * H)}}}
        with pytest.raises(ValueError, match="no attention with query/key kernels"):
            _clip(p, jax.tree.map(jnp.zeros_like, p), logits, 1.0)
    # "off by default": both Transformers record nothing unless asked
    assert so.nn.linen.Transformer.__dataclass_fields__["record_max_logits"].default is False
    assert inspect.signature(so.nn.nnx.Transformer.__init__).parameters["record_max_logits"].default is False
    assert "record_max_logits=True)   # off by default" in section
    # "inputs of RMS 1 unless input_norm=": the default input norm is sqrt(d_in)
    p = {"attn": {"query": {"kernel": _rand(1, D, N, H)}, "key": {"kernel": _rand(2, D, N, H)}}}
    np.testing.assert_allclose(
        so.diagnostics.qk_logit_bound(p)["attn"], so.diagnostics.qk_logit_bound(p, input_norm=np.sqrt(D))["attn"]
    )
    assert "inputs of RMS 1 unless `input_norm=`" in section
    assert inspect.signature(so.qk_clip).parameters["source"].default == "logits"


def f32(a):
    return jnp.asarray(a, jnp.float32)


def _qk_params(d=8, n=2, h=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "attn": {
            "query": {"kernel": f32(rng.standard_normal((d, n, h))), "bias": f32(rng.standard_normal((n, h)))},
            "key": {"kernel": f32(rng.standard_normal((d, n, h))), "bias": f32(rng.standard_normal((n, h)))},
        }
    }


def explicit_mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))


@pytest.mark.usefixtures("highest_precision")
def test_collect_max_logits_takes_the_max_of_several_sown_values():
    """Several values sown by one module (a tuple) give their elementwise max."""
    inter = {"intermediates": {"attn": {"max_logits": (f32([1.0, 5.0, 2.0]), f32([3.0, 0.5, 2.5]))}}}
    got = so.collect_max_logits(inter)
    assert set(got) == {"attn"}
    np.testing.assert_array_equal(np.asarray(got["attn"]), [3.0, 5.0, 2.5])


@pytest.mark.usefixtures("highest_precision")
def test_qk_logit_bound_uses_the_given_input_norm():
    """``input_norm=r``: the bound is ||W_q^h W_k^h^T||_2 r^2 / sqrt(d_h) (float64 SVD)."""
    params = _qk_params()
    got = so.diagnostics.qk_logit_bound(params, input_norm=2.0)["attn"]
    wq = np.asarray(params["attn"]["query"]["kernel"], np.float64)
    wk = np.asarray(params["attn"]["key"]["kernel"], np.float64)
    want = [np.linalg.norm(wq[:, h, :] @ wk[:, h, :].T, 2) * 4.0 / 2.0 for h in range(2)]
    np.testing.assert_allclose(np.asarray(got).reshape(-1), want, rtol=1e-4)


@pytest.mark.usefixtures("highest_precision")
def test_qk_clip_empty_bias_path_means_no_bias():
    """AttentionSpec(query_bias='', key_bias=''): the biases are left alone, only the kernels are clipped."""
    params = _qk_params()
    upd = jax.tree.map(jnp.zeros_like, params)
    spec = so.AttentionSpec(query="attn/query/kernel", key="attn/key/kernel", query_bias="", key_bias="")
    tx = so.qk_clip(1.0, attention={"attn": spec})
    out, _ = tx.update(upd, tx.init(params), params, max_logits={"attn": f32([4.0, 0.5])})
    # head 0: gamma = 1/4, factor 1/2: new = p / 2, update = -p / 2; head 1 untouched
    for side in ("query", "key"):
        p = np.asarray(params["attn"][side]["kernel"], np.float64)
        want = np.zeros_like(p)
        want[:, 0, :] = -p[:, 0, :] / 2
        np.testing.assert_allclose(np.asarray(out["attn"][side]["kernel"]), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(out["attn"][side]["bias"]), 0.0)


@pytest.mark.usefixtures("highest_precision")
def test_qk_clip_on_an_explicit_one_device_mesh():
    """On an Explicit mesh (one device) qk_clip gives the float64 values and keeps the parameters' shardings."""
    mesh = explicit_mesh()
    params = _qk_params()
    rng = np.random.default_rng(1)
    upd = jax.tree.map(lambda p: f32(0.01 * rng.standard_normal(p.shape)), params)
    logits = f32([4.0, 0.5])
    with jax.set_mesh(mesh):
        put = lambda t, s: jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, s)), t)
        ps, us = put(params, P("x")), put(upd, P("x"))
        ls = jax.device_put(logits, NamedSharding(mesh, P("x")))
        tx = so.qk_clip(1.0)
        out = jax.jit(lambda u, p, s: tx.update(u, tx.init(p), p, max_logits={"attn": s})[0])(us, ps, ls)
    for side in ("query", "key"):
        for leaf in ("kernel", "bias"):
            p = np.asarray(params["attn"][side][leaf], np.float64)
            u = np.asarray(upd["attn"][side][leaf], np.float64)
            want = u.copy()
            sl = (slice(None), 0) if leaf == "kernel" else (0,)
            want[sl] = (p[sl] + u[sl]) / 2 - p[sl]
            got = out["attn"][side][leaf]
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
            assert jax.typeof(got).sharding.spec == jax.typeof(us["attn"][side][leaf]).sharding.spec


def _one_window_data(context=8, vocab=13, seed=0):
    """A 'sequence' dataset whose only training (and validation) window is one fixed byte string:
    every batch lab.sweep samples is that window repeated, so the step's max logit is that window's."""
    from spectral_optax import lab

    stream = np.random.default_rng(seed).integers(0, vocab, context + 1).astype(np.uint8)
    return lab.Dataset("one_window", (stream,), (stream,), 1, 1, vocab, (context,), "sequence", context)


def _first_block_max_logits(p, x):
    """float64 reference: per-head max |q.k| / sqrt(d_h) (causal) of block 0 of the package GPT (fused QKV,
    layers stacked): LayerNorm(embed + pos) -> [q | k | v] = y W + b, heads of 16."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    t = len(x)
    h = p["embed"][x] + p["pos"][:t]
    y = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6) * p["ln_scale"] + p["ln_bias"]
    qkv = (y @ p["qkv_kernel"] + p["qkv_bias"]).reshape(t, 3, -1, 16)
    s = np.abs(np.einsum("tnh,snh->nts", qkv[:, 0], qkv[:, 1])) / 4.0
    return np.where(np.tril(np.ones((t, t), bool)), s, 0).max(axis=(1, 2))


def test_lab_sweep_records_the_max_logit_and_qk_clip_holds_it_at_tau():
    """benchmarks.qk_clip through lab.sweep, on one fixed window at LR 0 (the update is the clip alone): the
    per-step max logit recorded (``step_metrics``) equals the float64 forward of the run's own init; with
    ``so.qk_clip(tau)`` fed the logits (``update_args``) and chained last (``after_schedule``), every later step
    and the trained parameters (``final_metrics``) have each head at ``min(S^h, tau)``."""
    from spectral_optax import lab

    data = _one_window_data()
    family = lab.gpt_family(data, vary="width", depth=1, init="spectral", record_max_logits=True)
    geom = family(32).geometry(data.numpy_batch("train", [0])[0])
    x = np.asarray(data.train[0][:-1], np.int64)

    def leaves(p):
        b = jax.tree.map(lambda a: a[0], p["blocks"])  # layer 0 of the stack
        return {"embed": p["embed"]["embedding"], "pos": p["pos_embed"]["embedding"],
                "ln_scale": b["ln_attn"]["scale"], "ln_bias": b["ln_attn"]["bias"],
                "qkv_kernel": b["attn"]["qkv"]["kernel"], "qkv_bias": b["attn"]["qkv"]["bias"]}

    def run(after):
        (r,) = lab.sweep(
            family, lambda lr: so.muon(lr, geometry=geom), [32], [0.0], data, steps=2, batch_size=2, chunks=1,
            progress=False, eval_examples=1,
            update_args=lambda ml: {"max_logits": ml},
            step_metrics=lambda ml: {"max_logit": ml["blocks/attn"]},  # (layers, heads) per step
            after_schedule=after,
            final_metrics=lambda w: lambda p: {**leaves(p), "max_logit": family(w).loss_with_aux(
                p, jnp.asarray(x)[None], jnp.asarray(data.train[0][1:], jnp.int32)[None])[1]["blocks/attn"]},
        ).runs
        return r, np.asarray(r["step_metrics"]["max_logit"], np.float64)[:, 0]  # (steps, heads)

    plain, s_plain = run(None)
    s0 = _first_block_max_logits(plain["final_metrics"], x)  # LR 0, no clip: the final params are the init
    assert s0.shape == (2,)
    np.testing.assert_allclose(s_plain, np.broadcast_to(s0, (2, 2)), rtol=1e-4)
    tau = 0.5 * (s0.min() + s0.max()) if s0.max() > 1.2 * s0.min() else 0.7 * s0.min()
    clipped, s_clip = run(lambda w: so.qk_clip(tau, geometry=geom))
    expected = np.minimum(s0, tau)
    np.testing.assert_allclose(s_clip[0], s0, rtol=1e-4)  # the same init and window, before any clip
    np.testing.assert_allclose(s_clip[1:], np.broadcast_to(expected, (1, 2)), rtol=1e-4)
    assert s_clip[1:].max() <= tau * (1 + 1e-4) and s0.max() > tau
    np.testing.assert_allclose(np.asarray(clipped["final_metrics"]["max_logit"])[0], expected, rtol=1e-4)
    np.testing.assert_allclose(_first_block_max_logits(clipped["final_metrics"], x), expected, rtol=1e-4)
