"""``python -m benchmarks.coord_check`` (its ``main(argv)`` and JSON) against a float64 NumPy re-implementation of the
one SGD step, with the per-rule init stds and layer LRs written here from the benchmark's documented rules."""

import functools
import json
import math

import jax
import numpy as np
import pytest

D0, ETA, SEEDS, WIDTHS = 32, 0.1, [0, 1], [64, 128]
GAIN = math.sqrt(2.0)


def documented_scales(n):
    """``{rule: (stds, lrs)}`` for layers ``d0 -> n -> n -> 1``, from the benchmark's docstring: muP's std
    ``gain/sqrt(d_in) * min(1, sqrt(d_out/d_in))`` and LRs ``eta * (n/64, 1, 64/n)``; NTP and SP the n = 64 muP
    std scaled like ``1/sqrt(d_in)``, NTP's LRs ``eta * 64/d_in`` relative to n = 64, SP's one ``eta``."""
    g = GAIN
    mup_std = [g / math.sqrt(D0), g / math.sqrt(n), g / n]
    std = [g / math.sqrt(D0), g / math.sqrt(n), g / (8 * math.sqrt(n))]
    return {"muP": (mup_std, [n / 64, 1.0, 64 / n]), "NTP": (std, [1.0, 64 / n, 64 / n]), "SP": (std, [1.0] * 3)}


@functools.cache
def draws(n, seed):
    """The benchmark's draws, ``split(key(seed), 4)``: the example x, then the three standard normal matrices."""
    kx, k1, k2, k3 = jax.random.split(jax.random.key(seed), 4)
    x = np.asarray(jax.random.normal(kx, (D0,)), np.float64)
    return x, [np.asarray(jax.random.normal(k, s), np.float64) for k, s in ((k1, (D0, n)), (k2, (n, n)), (k3, (n, 1)))]


def numpy_one_step(n, seed, std, lr):
    """One SGD step on loss -f in float64; the metrics the benchmark records."""
    x, Z = draws(n, seed)
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
    Wn = [w - ETA * l * g for w, l, g in zip(W, lr, (g1, g2, g3))]
    _, b1, _, b2, fn = fwd(Wn)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    dW2 = Wn[1] - W[1]
    head, hidden = fwd(W[:2] + Wn[2:])[4] - f, fwd(Wn[:2] + W[2:])[4] - f
    return {
        "h1": rel(b1, h1),
        "h2": rel(b2, h2),
        "out": abs(fn - f),
        "out_head": head,
        "out_hidden": hidden,
        "out_cross": (fn - f) - head - hidden,
        "W2_spectral": np.linalg.svd(dW2, compute_uv=False)[0] / np.linalg.svd(W[1], compute_uv=False)[0],
        "W2_frobenius": rel(Wn[1], W[1]),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from benchmarks import coord_check

    out = tmp_path_factory.mktemp("coord_check")
    path = out / "coord_check.json"
    with jax.default_matmul_precision("highest"):  # true float32 on GPU / TPU too (see conftest.py)
        coord_check.main(
            [
                "--max-width",
                str(WIDTHS[-1]),
                "--seeds",
                str(len(SEEDS)),
                "--eta",
                str(ETA),
                "--json",
                str(path),
                "--out",
                str(out),
            ]
        )
    return json.loads(path.read_text())


def test_one_step_matches_numpy(report):
    assert report["widths"] == WIDTHS and report["seeds"] == len(SEEDS) and report["d0"] == D0
    for k, n in enumerate(WIDTHS):
        for rule, (std, lr) in documented_scales(n).items():
            ref = [numpy_one_step(n, seed, std, lr) for seed in SEEDS]
            for m in ref[0]:
                v = np.array([r[m] for r in ref])
                tol = 2e-2 if m == "W2_spectral" else 1e-3  # W2's norm: 40 power iterations
                got, got_std = report["results"][rule][m][k], report["results"][rule][m + "_std"][k]
                assert got == pytest.approx(v.mean(), rel=tol, abs=1e-6), (rule, m, n)
                assert got_std == pytest.approx(v.std(), rel=5 * tol, abs=1e-5), (rule, m, n)
    # the read-out update alone changes f by exactly eta * lr_out * ||h2||^2 (> 0): the SP output term
    assert all(v > 0 for r in report["results"].values() for v in r["out_head"])


def test_rules_coincide_at_64_and_trust_ratios_split_by_sqrt_width(report):
    res = report["results"]
    for m in ("h1", "h2", "out", "W2_spectral", "W2_frobenius"):
        for rule in ("NTP", "SP"):  # muP = NTP = SP at 64
            assert res[rule][m][0] == pytest.approx(res["muP"][m][0], rel=1e-5), (rule, m)
        assert res["LARS"][m][0] == pytest.approx(res["LARS-spectral"][m][0], rel=1e-5), m  # LARS = corrected at 64
    # one example: dW2 is rank one, so the spectral ratio is the Frobenius ratio, sqrt(128 / 64) on every seed
    ratio = res["LARS"]["W2_spectral"][-1] / res["LARS-spectral"]["W2_spectral"][-1]
    assert ratio == pytest.approx(math.sqrt(2.0), rel=1e-4)
    # LARS: ||dW2||_F = c / sqrt(min(d_in, d_out) at n = 64) * ||W2||_F, c = 0.08 (the default --trust-coefficient)
    assert res["LARS"]["W2_frobenius"][-1] == pytest.approx(0.08 / math.sqrt(64), rel=1e-4)
