"""lab.regret on synthetic sweeps whose answer is known in closed form."""

import math
import types

import numpy as np
import pytest

from spectral_optax import lab
from spectral_optax.lab import REGRET_TOLERANCE, transfer_verdict, widest_regret

LR_STAR = 0.01 * 2**0.3  # the true optimum, 0.3 grid steps above the grid point 0.01
GRID = [0.01 * 2.0**k for k in range(-3, 4)]


def loss(lr, seed=0):
    """2 + 0.05 * (log2(lr / LR_STAR))^2, plus a per-seed offset (cancels in the regret)."""
    return 2.0 + 0.05 * math.log2(lr / LR_STAR) ** 2 + 0.1 * seed


def runs_at(lrs, seeds=(0, 1), size=256):
    return [
        {"size": size, "seed": s, "lr": lr, "train_loss": loss(lr, s), "val_loss": loss(lr, s) + 0.5, "diverged": False}
        for s in seeds
        for lr in lrs
    ]


def test_regret_on_a_parabola_in_log_lr():
    transferred = 0.01 * 2.0**1.7  # 1.4 grid steps above the optimum; run at that LR
    r = lab.regret(runs_at(GRID + [transferred]), transferred, grid=GRID)
    # grid minimum is 0.01 (0.3 steps from the optimum): loss 2 + 0.05 * 0.09 (+ mean seed offset 0.05)
    best = 2.0 + 0.05 * 0.3**2 + 0.05
    assert r["best_loss"] == pytest.approx(best, abs=1e-12)
    assert r["best_lr_grid"] == pytest.approx(0.01)
    # the loss is an exact parabola in log(lr), so the refined best LR is the true optimum
    assert r["best_lr"] == pytest.approx(LR_STAR, rel=1e-9)
    assert r["loss"] == pytest.approx(2.0 + 0.05 * 1.4**2 + 0.05, abs=1e-12)
    assert r["regret"] == pytest.approx(0.05 * (1.4**2 - 0.3**2), abs=1e-12)
    assert r["regret_steps"] == pytest.approx(1.4, abs=1e-9)
    assert not r["interpolated"]
    # per seed: the seed offsets cancel
    assert r["per_seed"] == pytest.approx({0: 0.05 * (1.4**2 - 0.3**2), 1: 0.05 * (1.4**2 - 0.3**2)}, abs=1e-12)


def test_reference_all_uses_every_lr_and_grid_default_excludes_lr():
    near = 0.01 * 2.0**0.25  # closer to the optimum than any grid point
    runs = runs_at(GRID + [near])
    on_grid = lab.regret(runs, near)  # grid inferred: every LR but `near`
    assert on_grid["regret"] == pytest.approx(0.05 * (0.05**2 - 0.3**2), abs=1e-12) and on_grid["regret"] < 0
    assert lab.regret(runs, near, reference="all")["regret"] == pytest.approx(0.0, abs=1e-12)
    other = lab.regret(runs, 0.04, grid=GRID, reference="all")  # a grid LR, reference = the run at `near`
    assert other["regret"] == pytest.approx(0.05 * (1.7**2 - 0.05**2), abs=1e-12)
    assert other["regret_steps"] == pytest.approx(1.7, abs=1e-9)


def test_interpolated_between_grid_points_and_too_low_lr_is_negative_steps():
    lr = 0.01 * 2.0**-1.5  # halfway between 0.005 and 0.0025 in log(lr); never run
    r = lab.regret(runs_at(GRID), lr, grid=GRID, metric="val_loss")
    expect = 0.5 * (loss(0.005) + loss(0.0025)) + 0.5 + 0.05  # val offset, mean seed offset
    assert r["interpolated"]
    assert r["loss"] == pytest.approx(expect, abs=1e-12)
    assert r["regret"] == pytest.approx(expect - (loss(0.01) + 0.5 + 0.05), abs=1e-12)
    assert r["regret_steps"] == pytest.approx(-1.8, abs=1e-9)


def test_diverged_run_at_lr_is_infinite_regret_and_sizes_are_separated():
    runs = runs_at(GRID + [1.0]) + runs_at(GRID, size=512)
    for r in runs:
        if r["lr"] == 1.0 and r["seed"] == 1:
            r["train_loss"], r["diverged"] = None, True
    with pytest.raises(ValueError, match="size="):
        lab.regret(runs, 1.0, grid=GRID)
    r = lab.regret(runs, 1.0, grid=GRID, size=256)
    assert r["regret"] == np.inf and r["per_seed"][1] == np.inf and np.isfinite(r["per_seed"][0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": 0.0}, "finite positive"),
        ({"lr": 10.0}, "outside the grid"),
        ({"lr": 0.01, "reference": "x"}, "reference"),
    ],
)
def test_bad_input(kwargs, match):
    lr = kwargs.pop("lr")
    with pytest.raises(ValueError, match=match):
        lab.regret(runs_at(GRID), lr, grid=GRID, **kwargs)
    with pytest.raises(ValueError, match="no runs at grid"):
        lab.regret(runs_at(GRID[:3]), 0.01, grid=GRID)


# The width studies' regret and verdict (lab.widest_regret, lab.transfer_verdict) on synthetic sweeps with a
# known answer (GRID above: the same factor-2 grid).
def runs_with_optima(optima, seeds=(0, 1)):
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
    results = {n: types.SimpleNamespace(runs=runs_with_optima(o)) for n, o in cases.items()}
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
