"""Alignment at init and the stable-rank helpers, against float64 NumPy references."""

import json
import math

import jax
import numpy as np
import pytest

from spectral_optax import Geometry
from spectral_optax import diagnostics as dg

# float64 references: run the JAX side with float32-accurate matmuls on every backend (conftest.py)
pytestmark = pytest.mark.usefixtures("highest_precision")


def gaussian(seed, shape, std=1.0):
    return (std * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_init_alignment_matches_float64_reference():
    w, x = gaussian(0, (30, 50), 0.2), gaussian(1, (7, 30))
    out = dg.init_alignment(w, x)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    top = np.linalg.svd(w64, compute_uv=False)[0]
    a = np.linalg.norm(x64 @ w64, axis=1) / (top * np.linalg.norm(x64, axis=1))
    sigma = np.sqrt(np.mean(w64**2))
    np.testing.assert_allclose(out["spectral_norm"], [top], rtol=1e-5)
    np.testing.assert_allclose(out["alignment"], [a.mean()], rtol=1e-5)
    np.testing.assert_allclose(out["sigma"], [sigma], rtol=1e-5)
    np.testing.assert_allclose(out["predicted_spectral_norm"], [sigma * (math.sqrt(30) + math.sqrt(50))], rtol=1e-5)
    np.testing.assert_allclose(out["predicted_alignment"], [math.sqrt(50) / (math.sqrt(30) + math.sqrt(50))])


def test_init_alignment_reads_the_geometry_per_slice():
    k = gaussian(2, (2, 3, 3, 4, 6))  # 2 stacked conv kernels: d_in = 3*3*4 = 36, d_out = 6
    g = Geometry(k.shape, "matrix", (1, 2, 3), (4,))
    x = gaussian(3, (5, 36))
    out = dg.init_alignment(k, x, geometry=g)
    for i in range(2):
        m = k[i].reshape(36, 6).astype(np.float64)
        top = np.linalg.svd(m, compute_uv=False)[0]
        a = np.linalg.norm(x @ m, axis=1) / (top * np.linalg.norm(x, axis=1))
        np.testing.assert_allclose(out["spectral_norm"][i], top, rtol=1e-5)
        np.testing.assert_allclose(out["alignment"][i], a.mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="d_in=36"):
        dg.init_alignment(k, gaussian(3, (5, 4)), geometry=g)


def test_claim_1_holds_for_gaussian_init():
    """||W||_* ~ sigma (sqrt(m) + sqrt(n)) and the alignment is >= about 1/2 when d_out >= d_in."""
    for d_in, d_out in ((256, 256), (128, 512)):
        out = dg.init_alignment(gaussian(d_in, (d_in, d_out), 0.05), key=jax.random.key(1), num_inputs=32)
        ratio = float(out["spectral_norm"][0] / out["predicted_spectral_norm"][0])
        # Over 5 draws of W and of the key (2026-12-01): ratio 0.984-1.001, alignment 0.49-0.68, and the
        # alignment within 2% of its prediction (rtol 0.1 below).
        assert 0.9 < ratio < 1.02, ratio
        assert float(out["alignment"][0]) > 0.45
        np.testing.assert_allclose(out["alignment"], out["predicted_alignment"], rtol=0.1)


def np_mlp_grad(x, ws, act, dact, loss, y=None):
    """Manual float64 backprop of a bias-free MLP; returns the gradient of every weight."""
    hs, zs = [x], []
    for w in ws[:-1]:
        zs.append(hs[-1] @ w)
        hs.append(act(zs[-1]))
    f = hs[-1] @ ws[-1]
    b = x.shape[0]
    if loss == "neg_f":
        df = -np.ones_like(f) / b
    elif loss == "mse":
        df = (f - y.reshape(f.shape)) / b
    else:
        p = np.exp(f - f.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        df = (p - np.eye(f.shape[1])[y]) / b
    grads = [None] * len(ws)
    delta = df
    for i in range(len(ws) - 1, -1, -1):
        grads[i] = hs[i].T @ delta
        if i:
            delta = (delta @ ws[i].T) * dact(zs[i - 1])
    return grads


@pytest.mark.parametrize("activation, loss", [("relu", "neg_f"), ("tanh", "mse"), ("tanh", "xent")])
def test_mlp_batch_gradient_matches_manual_backprop(activation, loss):
    x = gaussian(4, (9, 5))
    width, depth, key = 7, 2, jax.random.key(5)
    n_out = 3 if loss == "xent" else 1
    y = np.arange(9) % 3 if loss == "xent" else gaussian(6, (9,))
    gain = math.sqrt(2.0) if activation == "relu" else 1.0
    # the documented init: Gaussian, std gain / sqrt(fan_in), one key per layer from split(key, depth + 1)
    dims = [5, width, width, n_out]
    keys = jax.random.split(key, depth + 1)
    ws = [np.asarray(gain / math.sqrt(a) * jax.random.normal(k, (a, b)), np.float64)
          for k, a, b in zip(keys, dims[:-1], dims[1:])]
    if activation == "relu":
        act, dact = (lambda z: np.maximum(z, 0)), (lambda z: (z > 0).astype(float))
    else:
        act, dact = np.tanh, (lambda z: 1 - np.tanh(z) ** 2)
    expect = np_mlp_grad(x.astype(np.float64), ws, act, dact, loss, y)
    for layer in range(depth + 1):
        got = dg.mlp_batch_gradient(x, y, width=width, key=key, activation=activation, layer=layer,
                                    depth=depth, num_outputs=n_out, loss=loss)
        np.testing.assert_allclose(got, expect[layer], rtol=1e-4, atol=1e-6)


def test_outer_product_sum_stable_rank():
    one = np.asarray(dg.outer_product_sum(jax.random.key(0), 40, 30, 1), np.float64)
    s = np.linalg.svd(one, compute_uv=False)
    assert one.shape == (40, 30) and s[1] < 1e-5 * s[0]  # rank one
    many = np.asarray(dg.outer_product_sum(jax.random.key(1), 64, 64, 8192), np.float64)
    s = np.linalg.svd(many, compute_uv=False)
    np.testing.assert_allclose(dg.stable_rank(many), (s**2).sum() / s[0] ** 2, rtol=1e-4)
    # -> d / 4 = 16 for a square Gaussian matrix; the top singular value fluctuates (Tracy-Widom), and over keys
    # 1, 11, ..., 41 the stable rank measured 15.3-18.5 (2026-12-01; the old upper bar 17.5 failed on key 31).
    assert 12 < (s**2).sum() / s[0] ** 2 < 21


def test_errors():
    with pytest.raises(ValueError, match="matrix"):
        dg.init_alignment(np.ones(4, np.float32), geometry=Geometry.vector((4,)))
    with pytest.raises(TypeError, match="activation"):
        dg.mlp_batch_gradient(np.ones((2, 3)), width=4, key=jax.random.key(0), activation="gelu")
    with pytest.raises(ValueError, match="needs targets"):
        dg.mlp_batch_gradient(np.ones((2, 3)), width=4, key=jax.random.key(0), loss="mse")


@pytest.mark.slow
def test_benchmark_smoke(tmp_path):
    """benchmarks.stable_rank at toy size: the JSON, the figure, and the paper's ordering
    (ReLU < tanh < independent outer products) at the largest batch."""
    from benchmarks import stable_rank

    path = tmp_path / "sr.json"
    stable_rank.main(["--quick", "--width", "64", "--batch-sizes", "1,16,256", "--seeds", "2",
                      "--data-width", "32", "--json", str(path), "--out", str(tmp_path)])
    res = json.loads(path.read_text())
    last = {k: v["mean"][-1] for k, v in res["results"].items()}
    assert all(v[0] == pytest.approx(1.0, abs=1e-3) for v in (r["mean"] for r in res["results"].values()))
    assert last["relu"] < last["tanh"] < last["independent"], last
    assert (tmp_path / "stable_rank.png").stat().st_size > 1000


def test_example_weights_select_a_sub_batch():
    x, y = gaussian(8, (12, 6)), np.arange(12) % 4
    mask = (np.arange(12) < 5).astype(np.float32)
    kw = {"width": 9, "key": jax.random.key(2), "activation": "tanh", "num_outputs": 4, "loss": "xent"}
    np.testing.assert_allclose(dg.mlp_batch_gradient(x, y, example_weights=mask, **kw),
                               dg.mlp_batch_gradient(x[:5], y[:5], **kw), rtol=1e-5, atol=1e-7)
    full = np.asarray(dg.outer_product_sum(jax.random.key(3), 7, 5, 12), np.float64)
    part = np.asarray(dg.outer_product_sum(jax.random.key(3), 7, 5, 12, example_weights=mask), np.float64)
    ku, kv = jax.random.split(jax.random.key(3))
    u = np.asarray(jax.random.normal(ku, (12, 7)), np.float64)
    v = np.asarray(jax.random.normal(kv, (12, 5)), np.float64)
    np.testing.assert_allclose(full, u.T @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(part, u[:5].T @ v[:5], rtol=1e-5, atol=1e-6)
