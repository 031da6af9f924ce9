"""scale_by_spectral_trust_ratio against a float64 NumPy / SVD reference."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so


def rng(seed, shape, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def reference(u, w, slices, k, coeff=1.0):
    """float64: per slice (a list of index tuples), u * coeff * ||w||_F / (sqrt(k) ||u||_F)."""
    u64, w64 = u.astype(np.float64), w.astype(np.float64)
    out = np.empty_like(u64)
    for idx in slices:
        un, wn = np.linalg.norm(u64[idx]), np.linalg.norm(w64[idx])
        ratio = 1.0 if un == 0 or wn == 0 else coeff * wn / (np.sqrt(k) * un)
        out[idx] = u64[idx] * ratio
    return out


PARAMS = {
    "Dense_0": {"kernel": rng(0, (12, 40)), "bias": rng(1, (40,))},
    "Dense_1": {"kernel": rng(2, (3, 40, 24), 0.3)},  # 3 stacked (40, 24) matrices
    "Conv_0": {"kernel": rng(3, (3, 3, 4, 6))},  # fan-in 3*3*4 = 36, fan-out 6
    "head": {"kernel": rng(4, (24, 1))},
}
GRADS = jax.tree.map(lambda x: rng(7, x.shape, 1e-3), PARAMS)
ALL = [(slice(None),)]
STACKED = [(i,) for i in range(3)]


@pytest.mark.parametrize("rule", ["spectral", "lars"])
def test_matches_float64_reference_per_slice(rule):
    coeff = 0.3
    tx = so.scale_by_spectral_trust_ratio(rule=rule, trust_coefficient=coeff)
    out, state = jax.jit(tx.update)(GRADS, tx.init(PARAMS), PARAMS)
    assert isinstance(state, optax.EmptyState)
    spec = rule == "spectral"
    expect = {
        ("Dense_0", "kernel"): reference(GRADS["Dense_0"]["kernel"], PARAMS["Dense_0"]["kernel"], ALL,
                                         12 if spec else 1, coeff),
        ("Dense_0", "bias"): reference(GRADS["Dense_0"]["bias"], PARAMS["Dense_0"]["bias"], ALL, 1, coeff),
        ("Dense_1", "kernel"): reference(GRADS["Dense_1"]["kernel"], PARAMS["Dense_1"]["kernel"], STACKED,
                                         24 if spec else 1, coeff),
        ("Conv_0", "kernel"): reference(GRADS["Conv_0"]["kernel"], PARAMS["Conv_0"]["kernel"], ALL,
                                        6 if spec else 1, coeff),
        ("head", "kernel"): reference(GRADS["head"]["kernel"], PARAMS["head"]["kernel"], ALL, 1, coeff),
    }
    for (a, b), e in expect.items():
        np.testing.assert_allclose(np.asarray(out[a][b], np.float64), e, rtol=2e-5, err_msg=f"{a}/{b}")


def test_lars_equals_optax_trust_ratio_on_plain_leaves():
    params = {"Dense_0": {"kernel": PARAMS["Dense_0"]["kernel"]}, "head": PARAMS["head"]}
    grads = {"Dense_0": {"kernel": GRADS["Dense_0"]["kernel"]}, "head": GRADS["head"]}
    ours = so.scale_by_spectral_trust_ratio(rule="lars")
    theirs = optax.scale_by_trust_ratio()
    a, _ = ours.update(grads, ours.init(params), params)
    b, _ = theirs.update(grads, theirs.init(params), params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5)


def test_spectral_ratio_is_flat_in_width_and_lars_grows():
    """The paper's argument, with a float64 SVD: Gaussian W (full rank), rank-one update.

    A fixed Frobenius ratio gives ||dW||_* / ||W||_* ~ sqrt(n) / 2; the corrected
    rule gives ~ 1 / 2 at every width."""
    ratios = {"spectral": [], "lars": []}
    widths = (64, 512)
    for n in widths:
        w = rng(n, (n, n), 1 / np.sqrt(n))
        g = np.outer(rng(n + 1, (n,)), rng(n + 2, (n,)))  # a one-example gradient: rank one
        for rule, values in ratios.items():
            tx = so.scale_by_spectral_trust_ratio(rule=rule, trust_coefficient=0.1)
            u, _ = tx.update({"Dense_0": {"kernel": g}}, optax.EmptyState(), {"Dense_0": {"kernel": w}})
            u = np.asarray(u["Dense_0"]["kernel"], np.float64)
            s_u = np.linalg.svd(u, compute_uv=False)[0]
            s_w = np.linalg.svd(w.astype(np.float64), compute_uv=False)[0]
            values.append(s_u / s_w)
    spec, lars = np.array(ratios["spectral"]), np.array(ratios["lars"])
    assert spec.max() / spec.min() < 1.1, spec  # flat: sqrt(n)||W||_* / ||W||_F -> 2 at every n
    np.testing.assert_allclose(spec, 0.1 / 2, rtol=0.1)
    np.testing.assert_allclose(lars[-1] / lars[0], np.sqrt(widths[-1] / widths[0]), rtol=0.1)


def test_zero_norms_pass_through_and_no_nan():
    params = {"Dense_0": {"kernel": np.zeros((4, 8), np.float32)}, "head": {"kernel": np.ones((8, 1), np.float32)}}
    grads = {"Dense_0": {"kernel": np.ones((4, 8), np.float32)}, "head": {"kernel": np.zeros((8, 1), np.float32)}}
    tx = so.scale_by_spectral_trust_ratio()
    out, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(out["Dense_0"]["kernel"], 1.0)  # ||W|| = 0: ratio 1
    np.testing.assert_array_equal(out["head"]["kernel"], 0.0)  # ||U|| = 0: stays 0
    big = {"Dense_0": {"kernel": np.full((4, 8), 1e30, np.float32)}}
    tiny = {"Dense_0": {"kernel": np.full((4, 8), 1e-30, np.float32)}}
    out, _ = tx.update(tiny, tx.init(big), big)
    assert np.all(np.isfinite(out["Dense_0"]["kernel"]))
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out["Dense_0"]["kernel"], np.float64)),
                               np.sqrt(32) * 1e30 / 2, rtol=1e-5)


def test_bf16_and_chain_training_step():
    params = {"Dense_0": {"kernel": jnp.asarray(PARAMS["Dense_0"]["kernel"], jnp.bfloat16)}}
    grads = jax.tree.map(lambda x: x * 0.01, params)
    tx = optax.chain(so.scale_by_spectral_trust_ratio(trust_coefficient=0.5), optax.scale(-1.0))
    out, _ = tx.update(grads, tx.init(params), params)
    assert out["Dense_0"]["kernel"].dtype == jnp.bfloat16
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out["Dense_0"]["kernel"], np.float64)),
                               0.5 * np.linalg.norm(w) / np.sqrt(12), rtol=2e-2)


def test_errors():
    tx = so.scale_by_spectral_trust_ratio()
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(GRADS, tx.init(PARAMS))
    with pytest.raises(ValueError, match="rule must be"):
        so.scale_by_spectral_trust_ratio(rule="lamb")
    with pytest.raises(ValueError, match="trust_coefficient"):
        so.scale_by_spectral_trust_ratio(trust_coefficient=-1.0)
    bad = {"Dense_0": {"kernel": np.ones((4, 8), np.float32)}}
    with pytest.raises(ValueError, match="Dense_0/kernel"):
        tx.update(bad, tx.init(bad), {"Dense_0": {"kernel": np.ones((8, 4), np.float32)}})


STACKED_ms = {r"blocks/w$": {"kind": "matrix", "fan_in_axes": (1,), "fan_out_axes": (2,)}}


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def trust_ratio_reference(u, w, k, c=1.0):
    """Per slice: ``u * c ||w||_F / (sqrt(k) ||u||_F)`` (float64)."""
    nu = np.linalg.norm(u, axis=(-2, -1), keepdims=True)
    nw = np.linalg.norm(w, axis=(-2, -1), keepdims=True)
    return u * c * nw / (np.sqrt(k) * nu)


@pytest.mark.usefixtures("highest_precision")
def test_trust_ratio_reads_the_geometry_override():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 4, 6))
    u = rng.standard_normal((3, 4, 6))
    tx = so.scale_by_spectral_trust_ratio(trust_coefficient=0.3, geometry=STACKED_ms)
    got, _ = tx.update(f32({"blocks": {"w": u}}), tx.init(f32({"blocks": {"w": w}})), f32({"blocks": {"w": w}}))
    np.testing.assert_allclose(np.asarray(got["blocks"]["w"]), trust_ratio_reference(u, w, k=4, c=0.3),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")
def test_trust_ratio_zero_update_slice_stays_zero_with_min_norm():
    """A slice whose update is 0 passes through (ratio 1, as ``optax.scale_by_trust_ratio``),
    also when ``min_norm > 0`` floors its norm; the other slice gets the float64 ratio."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 4, 6))
    u = rng.standard_normal((2, 4, 6))
    u[0] = 0.0
    tx = so.scale_by_spectral_trust_ratio(min_norm=1e-3, geometry=STACKED_ms)
    got, _ = tx.update(f32({"blocks": {"w": u}}), tx.init(None), f32({"blocks": {"w": w}}))
    got = np.asarray(got["blocks"]["w"])
    assert np.all(got[0] == 0.0)
    np.testing.assert_allclose(got[1], trust_ratio_reference(u[1:], w[1:], k=4)[0], rtol=1e-5, atol=1e-6)
