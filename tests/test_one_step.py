"""benchmarks.coord_check.one_step against a float64 NumPy re-implementation of the one SGD step."""

import math

import jax
import numpy as np
import pytest

from benchmarks import coord_check as cc


def numpy_one_step(n, seed, eta, std, lr, d0=cc.D0):
    """One SGD step on loss -f, float64; returns the metrics of benchmarks.coord_check."""
    kx, k1, k2, k3 = jax.random.split(jax.random.key(seed), 4)
    x = np.asarray(jax.random.normal(kx, (d0,)), np.float64)
    Z = [np.asarray(jax.random.normal(k, s), np.float64) for k, s in ((k1, (d0, n)), (k2, (n, n)), (k3, (n, 1)))]
    W = [s * z for s, z in zip(std, Z)]

    def fwd(W):
        z1 = x @ W[0]
        h1 = np.maximum(z1, 0)
        z2 = h1 @ W[1]
        h2 = np.maximum(z2, 0)
        return z1, h1, z2, h2, float(h2 @ W[2][:, 0])

    z1, h1, z2, h2, f = fwd(W)
    # d(-f)/dW by hand
    g3 = -h2[:, None]
    d2 = -W[2][:, 0] * (z2 > 0)
    g2 = np.outer(h1, d2)
    d1 = (W[1] @ d2) * (z1 > 0)
    g1 = np.outer(x, d1)
    Wn = [w - eta * l * g for w, l, g in zip(W, lr, (g1, g2, g3))]
    _, b1, _, b2, fn = fwd(Wn)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    dW2 = Wn[1] - W[1]
    return {
        "h1": rel(b1, h1), "h2": rel(b2, h2), "out": abs(fn - f),
        "out_head": fwd(W[:2] + Wn[2:])[4] - f, "out_hidden": fwd(Wn[:2] + W[2:])[4] - f,
        "W2_spectral": np.linalg.svd(dW2, compute_uv=False)[0] / np.linalg.svd(W[1], compute_uv=False)[0],
        "W2_frobenius": rel(Wn[1], W[1]),
    }


SEEDS = [0, 1]


@pytest.fixture(scope="module")
def results():
    with jax.default_matmul_precision("highest"):  # true float32 on GPU / TPU too (see conftest.py)
        return {n: cc.one_step(n, SEEDS, 0.1) for n in (64, 256)}


@pytest.mark.parametrize("n", [64, 256])
def test_one_step_matches_numpy(results, n):
    eta, seeds = 0.1, SEEDS
    res = results[n]
    stds, lrs = cc.layer_scales(n)
    for i, rule in enumerate(cc.SGD_RULES):
        for k, seed in enumerate(seeds):
            ref = numpy_one_step(n, seed, eta, stds[i].astype(np.float64), lrs[i].astype(np.float64))
            for m, v in ref.items():
                tol = 2e-2 if m == "W2_spectral" else 1e-3  # W2's norm: 40 power iterations
                np.testing.assert_allclose(res[m][k, i], v, rtol=tol, atol=1e-6, err_msg=f"{rule} {m} n={n}")
    # the read-out update alone changes f by exactly eta * lr_out * ||h2||^2 (> 0): the SP output term
    assert np.all(res["out_head"] > 0)
    np.testing.assert_allclose(res["out"], np.abs(res["out_head"] + res["out_hidden"] + res["out_cross"]),
                               rtol=1e-5)


def test_rules_coincide_at_64_and_trust_ratios_split_by_sqrt_width(results):
    r64, r256 = results[64], results[256]
    for m in ("h1", "h2", "out", "W2_spectral", "W2_frobenius"):
        np.testing.assert_allclose(r64[m][0, :3], r64[m][0, 0], rtol=1e-5, err_msg=m)  # muP = NTP = SP at 64
        np.testing.assert_allclose(r64[m][0, 3], r64[m][0, 4], rtol=1e-5, err_msg=m)  # LARS = corrected at 64
    lars, spec = cc.RULES.index("LARS"), cc.RULES.index("LARS-spectral")
    # one example: dW2 is rank one, so the spectral ratio is the Frobenius ratio, sqrt(256 / 64) = 2
    np.testing.assert_allclose(r256["W2_spectral"][0, lars] / r256["W2_spectral"][0, spec], 2.0, rtol=1e-4)
    np.testing.assert_allclose(r256["W2_frobenius"][0, lars], 0.08 / math.sqrt(64), rtol=1e-4)
