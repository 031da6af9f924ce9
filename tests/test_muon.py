"""orthogonalize_via_newton_schulz and muon, checked against float64 NumPy references."""

import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax import Geometry


def exact_polar(x):
    """A user-supplied orthogonalizer: the exact U V^T (float32 SVD)."""
    u, _, vt = jnp.linalg.svd(x, full_matrices=False)
    return u @ vt


def np_polar(g):
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    return u @ vt


def rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


# ------------------------------------------------------------ the transform
def test_conv_kernel_uses_window_times_in():
    k = rand((3, 3, 4, 8))
    tx = so.orthogonalize_via_newton_schulz(ns_coefficients=exact_polar)
    params = {"Conv_0": {"kernel": jnp.asarray(k)}}
    out, _ = tx.update(params, tx.init(params))
    u = out["Conv_0"]["kernel"]
    # Reference: flatten to (window x in, out) = (36, 8); scale sqrt(d_out / d_in).
    ref = np_polar(k.reshape(36, 8)) * math.sqrt(8 / 36)
    np.testing.assert_allclose(np.asarray(u).reshape(36, 8), ref, atol=2e-5)


@pytest.mark.parametrize(
    "scale, expected",
    [
        ("spectral", lambda i, o: math.sqrt(o / i)),
        ("muon", lambda i, o: math.sqrt(max(1.0, o / i))),
        ("rms", lambda i, o: 0.2 * math.sqrt(max(i, o))),
        (0.5, lambda i, o: 0.5),
        (lambda g: g.d_in + g.d_out, lambda i, o: i + o),
    ],
)
def test_scale_conventions(scale, expected):
    params = {"a": {"kernel": jnp.asarray(rand((16, 64), 1))}, "b": {"kernel": jnp.asarray(rand((64, 16), 2))}}
    tx = so.orthogonalize_via_newton_schulz(scale=scale, ns_coefficients=exact_polar)
    out, _ = tx.update(params, tx.init(params))
    for name, (i, o) in {"a": (16, 64), "b": (64, 16)}.items():
        s = np.linalg.svd(np.asarray(out[name]["kernel"], np.float64), compute_uv=False)
        np.testing.assert_allclose(s, expected(i, o), rtol=1e-4)


def test_default_quintic_singular_values_and_tall_wide():
    g = {"w": jnp.asarray(rand((24, 72), 3)), "t": jnp.asarray(rand((72, 24), 4))}
    tx = so.orthogonalize_via_newton_schulz(scale=1.0)
    out, _ = tx.update(g, tx.init(g))
    for name in g:
        s = np.linalg.svd(np.asarray(out[name], np.float64), compute_uv=False)
        assert s.min() >= 0.6 and s.max() <= 1.25


def test_stacked_layers_and_qkv_splits_are_slices():
    stacked = rand((3, 8, 20), 5)  # nn.scan: 3 layers of (8, 20)
    qkv = rand((8, 3 * 10), 6)  # fused QKV, three (8, 10) blocks
    geometry = {
        "stack": Geometry.matrix((3, 8, 20)),
        "qkv": Geometry.matrix((8, 30), fan_out_splits=3),
    }
    tx = so.orthogonalize_via_newton_schulz(geometry=geometry, ns_coefficients=exact_polar)
    params = {"stack": jnp.asarray(stacked), "qkv": jnp.asarray(qkv)}
    out, _ = tx.update(params, tx.init(params))
    for i in range(3):
        np.testing.assert_allclose(
            np.asarray(out["stack"][i]), np_polar(stacked[i]) * math.sqrt(20 / 8), atol=2e-5
        )
    for j in range(3):
        block = qkv[:, 10 * j : 10 * (j + 1)]
        np.testing.assert_allclose(
            np.asarray(out["qkv"][:, 10 * j : 10 * (j + 1)]), np_polar(block) * math.sqrt(10 / 8), atol=2e-5
        )


def test_grouped_call_equals_per_leaf_call():
    # Same-shape leaves are orthogonalized in one batched call; results must
    # equal leaf-by-leaf calls (a stacked leaf, a plain one, a conv of equal shape).
    tree = {
        "a": {"kernel": jnp.asarray(rand((16, 48), 7))},
        "b": {"kernel": jnp.asarray(rand((2, 16, 48), 8))},
        "Conv_0": {"kernel": jnp.asarray(rand((4, 4, 48), 9))},
        "c": {"kernel": jnp.asarray(rand((48, 16), 10))},
    }
    geometry = {"b/kernel": Geometry.matrix((2, 16, 48))}
    tx = so.orthogonalize_via_newton_schulz(geometry=geometry)
    out, _ = jax.jit(tx.update)(tree, tx.init(tree))
    for name, leaf in tree.items():
        sub = {name: leaf}
        single, _ = tx.update(sub, tx.init(sub))
        np.testing.assert_allclose(np.asarray(out[name]["kernel"]), np.asarray(single[name]["kernel"]), atol=1e-6)


def test_zero_bf16_and_kinds_filter():
    params = {
        "Dense_0": {"kernel": jnp.zeros((8, 16), jnp.bfloat16), "bias": jnp.ones((16,), jnp.bfloat16)},
        "Dense_1": {"kernel": jnp.asarray(rand((16, 8), 11), jnp.bfloat16)},
    }
    tx = so.orthogonalize_via_newton_schulz(kinds=("matrix",))
    out, _ = jax.jit(tx.update)(params, tx.init(params))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(out))
    assert np.all(np.asarray(out["Dense_0"]["kernel"], np.float32) == 0)
    np.testing.assert_array_equal(np.asarray(out["Dense_0"]["bias"]), np.asarray(params["Dense_0"]["bias"]))
    assert np.all(np.isfinite(np.asarray(out["Dense_1"]["kernel"], np.float32)))


def test_transform_errors():
    with pytest.raises(ValueError, match="scale"):
        so.orthogonalize_via_newton_schulz(scale="frobenius")
    with pytest.raises(ValueError, match="kinds"):
        so.orthogonalize_via_newton_schulz(kinds=("matrix", "tensor"))
    tx = so.orthogonalize_via_newton_schulz()
    bad = {"blocks": {"w3d": jnp.ones((2, 3, 4))}}
    strict = so.orthogonalize_via_newton_schulz(geometry=so.GeometryMap(strict=True))
    with pytest.raises(so.GeometryError, match="blocks/w3d"):
        strict.update(bad, strict.init(bad))
    # Non-strict: the element-wise leaf is not one of the orthogonalized kinds and passes through.
    with pytest.warns(so.GeometryWarning, match="blocks/w3d"):
        out, _ = tx.update(bad, tx.init(bad))
    np.testing.assert_array_equal(out["blocks"]["w3d"], bad["blocks"]["w3d"])


# ------------------------------------------------------------------ muon
def _params(dtype=jnp.float32):
    return {
        "Embed_0": {"embedding": jnp.asarray(rand((12, 8), 20), dtype)},
        "Dense_0": {"kernel": jnp.asarray(rand((8, 24), 21), dtype), "bias": jnp.zeros((24,), dtype)},
        "LayerNorm_0": {"scale": jnp.ones((24,), dtype)},
        "head": {"kernel": jnp.asarray(rand((24, 5), 22), dtype)},
    }


def _grads(seed, dtype=jnp.float32):
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    return jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape, dtype), _params(dtype))


def test_muon_two_steps_match_numpy_reference():
    lr, beta, wd = 0.1, 0.9, 0.01
    tx = so.muon(lr, momentum=beta, weight_decay=wd, ns_coefficients=exact_polar)
    params = _params()
    state = tx.init(params)
    g1, g2 = _grads(1), _grads(2)
    u1, state = jax.jit(tx.update)(g1, state, params)
    u2, state = jax.jit(tx.update)(g2, state, params)
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    a, b = (np.asarray(g["Dense_0"]["kernel"], np.float64) for g in (g1, g2))
    m1 = (1 - beta) * a
    m2 = beta * m1 + (1 - beta) * b
    for u, m, g in ((u1, m1, a), (u2, m2, b)):
        nesterov = beta * m + (1 - beta) * g
        ref = -lr * (math.sqrt(24 / 8) * np_polar(nesterov) + wd * w)
        np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), ref, atol=2e-5)
    # Output head: Muon route by default, scale sqrt(5 / 24).
    gh = np.asarray(g1["head"]["kernel"], np.float64)
    wh = np.asarray(params["head"]["kernel"], np.float64)
    ref = -lr * (math.sqrt(5 / 24) * np_polar(gh) + wd * wh)
    np.testing.assert_allclose(np.asarray(u1["head"]["kernel"]), ref, atol=2e-5)


def test_muon_without_nesterov_uses_momentum():
    lr, beta = 0.05, 0.8
    tx = so.muon(lr, momentum=beta, nesterov=False, ns_coefficients=exact_polar)
    params = _params()
    state = tx.init(params)
    g1, g2 = _grads(3), _grads(4)
    _, state = tx.update(g1, state, params)
    u2, _ = tx.update(g2, state, params)
    a, b = (np.asarray(g["Dense_0"]["kernel"], np.float64) for g in (g1, g2))
    m2 = beta * (1 - beta) * a + (1 - beta) * b
    np.testing.assert_allclose(
        np.asarray(u2["Dense_0"]["kernel"]), -lr * math.sqrt(3) * np_polar(m2), atol=2e-5
    )


def test_muon_default_routes_embeddings_and_vectors_to_adamw():
    lr = 0.1
    tx = so.muon(lr, adam_learning_rate=0.01, ns_coefficients=exact_polar)
    params, g = _params(), _grads(5)
    u, _ = tx.update(g, tx.init(params), params)
    ref = optax.adamw(0.01, weight_decay=0.0)
    for path in (("Embed_0", "embedding"), ("Dense_0", "bias"), ("LayerNorm_0", "scale")):
        p, gg = params[path[0]][path[1]], g[path[0]][path[1]]
        expected, _ = ref.update(gg, ref.init(p), p)
        np.testing.assert_allclose(np.asarray(u[path[0]][path[1]]), np.asarray(expected), rtol=1e-6)
        # first Adam step = -lr * sign(g) (up to epsilon)
        np.testing.assert_allclose(np.asarray(u[path[0]][path[1]]), -0.01 * np.sign(gg), rtol=1e-4)


def test_muon_normalize_route_and_output_adamw():
    lr, wd = 0.1, 0.5
    tx = so.muon(lr, embedding="normalize", vector="normalize", output="adamw", weight_decay=wd)
    params, g = _params(), _grads(6)
    u, _ = tx.update(g, tx.init(params), params)
    # Embedding: every token's fan-out vector at RMS 1, plus weight decay.
    e, we = np.asarray(g["Embed_0"]["embedding"], np.float64), np.asarray(params["Embed_0"]["embedding"], np.float64)
    rms = np.sqrt(np.mean(e**2, axis=1, keepdims=True))
    np.testing.assert_allclose(np.asarray(u["Embed_0"]["embedding"]), -lr * (e / rms + wd * we), rtol=1e-4, atol=1e-6)
    # Vectors (bias, norm scale): RMS 1, no weight decay by default.
    for mod, name in (("Dense_0", "bias"), ("LayerNorm_0", "scale")):
        v = np.asarray(g[mod][name], np.float64)
        np.testing.assert_allclose(
            np.asarray(u[mod][name]), -lr * v / np.sqrt(np.mean(v**2)), rtol=1e-4, atol=1e-6
        )
    # Head on AdamW: -lr sign(g) at the first step.
    np.testing.assert_allclose(np.asarray(u["head"]["kernel"]), -lr * np.sign(np.asarray(g["head"]["kernel"])), rtol=1e-4)


def test_muon_custom_route_and_weight_decay_mask():
    custom = optax.sgd(1.0)
    mask = lambda p: jax.tree.map(lambda x: False, p)
    tx = so.muon(0.1, embedding=custom, weight_decay=1.0, weight_decay_mask=mask, ns_coefficients=exact_polar)
    params, g = _params(), _grads(7)
    u, _ = tx.update(g, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(u["Embed_0"]["embedding"]), -np.asarray(g["Embed_0"]["embedding"]))
    # No decay anywhere: the Dense update is the pure orthogonal factor.
    a = np.asarray(g["Dense_0"]["kernel"], np.float64)
    np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), -0.1 * math.sqrt(3) * np_polar(a), atol=2e-5)
    with pytest.raises(ValueError, match="embedding="):
        so.muon(0.1, embedding="sgd")


def test_muon_zero_grads_bf16_and_jit():
    params = _params(jnp.bfloat16)
    tx = so.muon(0.1, weight_decay=0.1)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    u, state = jax.jit(tx.update)(zeros, state, params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(u))
    assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in jax.tree.leaves((u, state)))
    # zero gradient: only weight decay moves the kernel
    np.testing.assert_allclose(
        np.asarray(u["Dense_0"]["kernel"], np.float32),
        -0.1 * 0.1 * np.asarray(params["Dense_0"]["kernel"], np.float32),
        rtol=2e-2,
    )
    new = optax.apply_updates(params, u)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new))


def test_muon_inject_hyperparams_and_schedule():
    sched = optax.linear_schedule(0.2, 0.0, 4)
    # A function-valued option must be declared static (inject_hyperparams
    # would otherwise treat it as a schedule).
    tx = optax.inject_hyperparams(so.muon, static_args=("ns_coefficients",))(
        learning_rate=sched, momentum=0.9, ns_coefficients=exact_polar
    )
    params, g = _params(), _grads(8)
    state = tx.init(params)
    step = jax.jit(tx.update)
    u0, state = step(g, state, params)
    u1, state = step(g, state, params)
    k0, k1 = (np.asarray(u["Dense_0"]["kernel"]) for u in (u0, u1))
    # Same gradient twice: the Nesterov direction is ~g both times, so the
    # update ratio is the schedule's ratio (0.15 / 0.2).
    np.testing.assert_allclose(k1 / 0.15, k0 / 0.2, atol=2e-4)
    _, state = step(g, state, params)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)


def test_muon_injected_momentum_and_betas_change_the_update_as_built():
    """An injected momentum / AdamW beta gives the update of muon built with that value."""
    params = _params()
    gs = [_grads(20 + i) for i in range(3)]
    for hp, value in (("momentum", 0.5), ("adam_b1", 0.5), ("adam_b2", 0.9)):
        tx = optax.inject_hyperparams(so.muon, static_args=("ns_coefficients",))(
            learning_rate=0.1, ns_coefficients=exact_polar)
        state = tx.init(params)
        state.hyperparams[hp] = jnp.asarray(value)
        built = so.muon(0.1, ns_coefficients=exact_polar, **{hp: value})
        default = so.muon(0.1, ns_coefficients=exact_polar)
        sb, sd = built.init(params), default.init(params)
        for g in gs:
            u, state = tx.update(g, state, params)
            ub, sb = built.update(g, sb, params)
            ud, sd = default.update(g, sd, params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), u, ub)
        assert any(not np.allclose(a, b, rtol=1e-4) for a, b in zip(jax.tree.leaves(ub), jax.tree.leaves(ud))), hp


def test_muon_state_checkpoint_round_trip():
    tx = so.muon(0.1, weight_decay=0.01, embedding="normalize")
    params = _params()
    step = jax.jit(tx.update)
    state = tx.init(params)
    _, state = step(_grads(9), state, params)
    # Save as plain numpy leaves (what a checkpointer stores), restore into the
    # structure of a fresh init, and continue: identical updates.
    leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
    restored = jax.tree.unflatten(jax.tree.structure(tx.init(params)), pickle.loads(pickle.dumps(leaves)))
    a, _ = step(_grads(10), state, params)
    b, _ = step(_grads(10), restored, params)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_muon_polar_express_option_and_stacked_geometry():
    params = {"blocks": {"mlp": {"kernel": jnp.asarray(rand((4, 16, 32), 12))}}}
    geometry = {r"blocks/mlp/kernel$": dict(kind="matrix", fan_in_axes=(-2,), fan_out_axes=(-1,))}
    tx = so.muon(1.0, geometry=geometry, ns_coefficients="polar_express", scale=1.0, momentum=0.0)
    g = {"blocks": {"mlp": {"kernel": jnp.asarray(rand((4, 16, 32), 13))}}}
    u, _ = tx.update(g, tx.init(params), params)
    for i in range(4):
        s = np.linalg.svd(-np.asarray(u["blocks"]["mlp"]["kernel"][i], np.float64), compute_uv=False)
        assert np.max(np.abs(s - 1)) < 0.01


def test_orthogonalize_default_acts_on_matrices_only():
    """``orthogonalize_via_newton_schulz()`` orthogonalizes matrices (float64 SVD reference) and passes
    embeddings and vectors through unchanged; naming the kinds normalizes them too."""
    rng = np.random.default_rng(0)
    g = {
        "Dense_0": {"kernel": jnp.asarray(rng.normal(size=(12, 8)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=(8,)), jnp.float32)},
        "Embed_0": {"embedding": jnp.asarray(rng.normal(size=(10, 8)), jnp.float32)},
    }  # fmt: skip
    tx = so.orthogonalize_via_newton_schulz(scale=1.0, ns_coefficients="quintic", ns_steps=12)
    out, _ = tx.update(g, tx.init(g))
    u, _, vt = np.linalg.svd(np.asarray(g["Dense_0"]["kernel"], np.float64), full_matrices=False)
    np.testing.assert_allclose(np.asarray(out["Dense_0"]["kernel"]), u @ vt, atol=0.3)  # quintic band
    assert np.array_equal(out["Dense_0"]["bias"], g["Dense_0"]["bias"])
    assert np.array_equal(out["Embed_0"]["embedding"], g["Embed_0"]["embedding"])
    every = so.orthogonalize_via_newton_schulz(scale=1.0, kinds=("matrix", "embedding", "vector"))
    out, _ = every.update(g, every.init(g))
    b, ob = (np.asarray(x, np.float64) for x in (g["Dense_0"]["bias"], out["Dense_0"]["bias"]))
    np.testing.assert_allclose(ob / np.linalg.norm(ob), b / np.linalg.norm(b), atol=1e-5)  # its direction,
    assert 0.5 < np.linalg.norm(ob) < 1.5  # at about unit norm (one singular value, inside the iteration's band)
    assert not np.array_equal(out["Embed_0"]["embedding"], g["Embed_0"]["embedding"])
