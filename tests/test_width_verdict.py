"""The width studies' regret and verdict (lab.widest_regret, lab.transfer_verdict) on synthetic sweeps with a known answer."""

import math
import types

import pytest

from spectral_optax import lab
from spectral_optax.lab import REGRET_TOLERANCE, transfer_verdict, widest_regret

GRID = [0.01 * 2.0**k for k in range(-3, 4)]


def runs(optima, seeds=(0, 1)):
    """Loss 2 + 0.05 log2(lr / optimum[size])^2 (+ 0.1 per seed) on GRID at each size."""
    return [
        {
            "size": w,
            "seed": s,
            "lr": lr,
            "train_loss": 2.0 + 0.05 * math.log2(lr / opt) ** 2 + 0.1 * s,
            "val_loss": None,
            "diverged": False,
        }
        for w, opt in optima.items()
        for s in seeds
        for lr in GRID
    ]


def test_widest_regret_and_verdict_on_known_parabolas():
    cases = {
        # the narrow optimum on the grid point 0.01; the wide one 1.3 grid steps below it: regret
        # 0.05 * (1.3^2 - 0.3^2) against the grid's best point 0.005 (0.3 steps from the optimum)
        "drifts": {64: 0.01, 512: 0.01 * 2**-1.3},
        # the wide optimum 0.1 steps above the narrow one: 0.01 is the wide grid's best point too
        "transfers": {64: 0.01, 512: 0.01 * 2**0.1},
    }
    results = {n: types.SimpleNamespace(runs=runs(o)) for n, o in cases.items()}
    summaries = {n: lab.summarize(r.runs) for n, r in results.items()}
    reg = widest_regret(results, summaries)
    assert reg["drifts"]["narrow"] == 64 and reg["drifts"]["wide"] == 512
    assert reg["drifts"]["lr"] == pytest.approx(0.01)
    assert reg["drifts"]["regret"] == pytest.approx(0.05 * (1.3**2 - 0.3**2), abs=1e-9)
    assert reg["drifts"]["per_seed"] == pytest.approx([0.05 * (1.3**2 - 0.3**2)] * 2, abs=1e-9)
    assert reg["transfers"]["regret"] == pytest.approx(0.0, abs=1e-12)
    v = transfer_verdict(reg)
    assert v["drifts"]["verdict"] == "does not" and v["transfers"]["verdict"] == "transfers"
    assert v["transfers"]["margin"] == pytest.approx(REGRET_TOLERANCE)


def test_verdict_is_the_seed_mean_curves():
    reg = {
        "noisy seeds": {"regret": 0.015, "per_seed": [0.0, 0.03]},
        "at the threshold": {"regret": 0.02, "per_seed": [0.018, 0.021]},
        "above": {"regret": 0.021, "per_seed": [0.0, 0.042]},
    }
    v = transfer_verdict(reg, tolerance=0.02)
    assert [v[k]["verdict"] for k in reg] == ["transfers", "transfers", "does not"]
    assert v["above"]["margin"] == pytest.approx(-0.001) and v["noisy seeds"]["per_seed"] == [0.0, 0.03]
