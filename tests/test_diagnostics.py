"""Diagnostics against float64 NumPy references."""


import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so
from spectral_optax import Geometry
from spectral_optax import diagnostics as dg


def rng_matrix(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_relative_change():
    a, b = rng_matrix(0, (5, 7)), rng_matrix(1, (5, 7))
    expect = np.linalg.norm((a - b).astype(np.float64)) / np.linalg.norm(b.astype(np.float64))
    np.testing.assert_allclose(dg.relative_change(a, b), expect, rtol=1e-5)
    assert float(dg.relative_change(np.zeros(3), np.zeros(3))) == 0.0
    assert float(dg.relative_change(np.ones(3), np.zeros(3))) == np.inf
    feats = dg.relative_feature_change({"h1": a, "h2": 2 * b}, {"h1": b, "h2": b})
    np.testing.assert_allclose(feats["h2"], 1.0, rtol=1e-6)


def test_spectral_norm_stable_rank_vs_svd():
    w = rng_matrix(2, (40, 24)).astype(np.float64)
    s = np.linalg.svd(w, compute_uv=False)
    np.testing.assert_allclose(dg.spectral_norm(w, method="svd"), s[0], rtol=1e-5)
    np.testing.assert_allclose(dg.stable_rank(w), (s**2).sum() / s[0] ** 2, rtol=1e-4)
    np.testing.assert_allclose(dg.frobenius_norm(w), np.linalg.norm(w), rtol=1e-6)
    # power iteration on a matrix with a clear spectral gap
    u, _, vt = np.linalg.svd(w, full_matrices=False)
    spec = np.geomspace(5.0, 0.1, 24)
    w2 = (u * spec) @ vt
    np.testing.assert_allclose(dg.spectral_norm(w2, method="power", iters=50), 5.0, rtol=1e-4)


def test_spectral_norm_uses_geometry():
    # conv kernel (3, 3, in=4, out=6): fan-in = window x in = 36
    k = rng_matrix(3, (3, 3, 4, 6))
    g = Geometry.matrix(k.shape, fan_in_axes=(0, 1, 2), fan_out_axes=(3,))
    expect = np.linalg.svd(k.reshape(36, 6).astype(np.float64), compute_uv=False)[0]
    np.testing.assert_allclose(dg.spectral_norm(k, g), expect, rtol=1e-5)
    # stacked layers (2, 8, 5): the max over slices
    st = rng_matrix(4, (2, 8, 5))
    expect = max(np.linalg.svd(st[i].astype(np.float64), compute_uv=False)[0] for i in range(2))
    np.testing.assert_allclose(dg.spectral_norm(st), expect, rtol=1e-5)


def test_relative_weight_change_tree():
    old = {"Dense_0": {"kernel": rng_matrix(5, (6, 9)), "bias": rng_matrix(6, (9,))}}
    new = {"Dense_0": {"kernel": rng_matrix(7, (6, 9)), "bias": rng_matrix(8, (9,))}}
    spec = dg.relative_weight_change(new, old)
    fro = dg.relative_weight_change(new, old, norm="frobenius")
    ko, kn = old["Dense_0"]["kernel"].astype(np.float64), new["Dense_0"]["kernel"].astype(np.float64)
    sv = lambda m: np.linalg.svd(m, compute_uv=False)[0]
    np.testing.assert_allclose(spec["Dense_0"]["kernel"], sv(kn - ko) / sv(ko), rtol=1e-5)
    np.testing.assert_allclose(fro["Dense_0"]["kernel"],
                               np.linalg.norm(kn - ko) / np.linalg.norm(ko), rtol=1e-5)
    bo, bn = old["Dense_0"]["bias"], new["Dense_0"]["bias"]
    # a bias is a (1, d_out) matrix: its spectral norm is its l2 norm
    np.testing.assert_allclose(spec["Dense_0"]["bias"],
                               np.linalg.norm(bn - bo) / np.linalg.norm(bo), rtol=1e-5)
    np.testing.assert_allclose(dg.relative_weight_change(kn, ko), sv(kn - ko) / sv(ko), rtol=1e-5)
    with pytest.raises(ValueError, match="norm"):
        dg.relative_weight_change(kn, ko, norm="nuclear")


def test_alignment():
    h = rng_matrix(9, (5, 16))
    w = rng_matrix(10, (16, 1))
    f = h @ w
    expect = np.mean(np.abs(f[:, 0]) / (np.linalg.norm(w) * np.linalg.norm(h, axis=1)))
    np.testing.assert_allclose(dg.alignment(f, w, h), expect, rtol=1e-5)
    # perfectly aligned read-out
    np.testing.assert_allclose(dg.alignment(h[:1] @ h[0], h[0], h[:1]), 1.0, rtol=1e-5)


def test_zero_and_bf16_inputs_are_finite():
    z = jnp.zeros((4, 4))
    assert float(dg.spectral_norm(z)) == 0.0
    assert np.isfinite(float(dg.stable_rank(z)))
    assert float(dg.relative_weight_change(z, z)) == 0.0
    w = jnp.asarray(rng_matrix(11, (8, 8)), jnp.bfloat16)
    assert np.isfinite(float(dg.spectral_norm(w))) and np.isfinite(float(dg.stable_rank(w)))
    assert np.isfinite(float(dg.alignment(w[:, :1], w[0], w)))
    big = jnp.full((3, 3), 1e30)
    assert np.isfinite(float(dg.relative_change(big * 1.5, big)))


def test_init_alignment_is_scale_invariant_for_small_weights():
    """alignment = mean ||x W|| / (||W||_2 ||x||) against float64 NumPy, also for a weight of scale 1e-3."""
    rng = np.random.default_rng(0)
    w = 1e-3 * rng.standard_normal((4, 6))
    x = rng.standard_normal((5, 4))
    ref = np.mean(np.linalg.norm(x @ w, axis=-1) / (np.linalg.svd(w, compute_uv=False)[0] * np.linalg.norm(x, axis=-1)))
    got = so.diagnostics.init_alignment(jnp.asarray(w, jnp.float32), jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(float(got["alignment"][0]), ref, rtol=1e-4)
