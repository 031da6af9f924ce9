"""``python -m benchmarks.recipe`` at a few steps (its ``main(argv)``, the sizes given by ``--proxy`` / ``--target`` /
``--multiples``): the account's arithmetic by hand, the regret's reference, the weight-decay study's rule (the
benchmark itself: docs/benchmarks.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spectral_optax import lab
from spectral_optax import transfer as st

pytestmark = pytest.mark.slow


def _seed_mean_min(path, **match):
    runs = [json.loads(line) for line in open(path)]
    runs = [r for r in runs if all(r[k] == v for k, v in match.items())]
    by_lr: dict = {}
    for r in runs:
        by_lr.setdefault(round(r["lr"], 12), []).append(r["train_loss"])
    return min(np.mean(v) for v in by_lr.values()), runs


#: The tiny sizes run here, ``(width, depth, steps, batch)``: the proxy, the targets by label, LR points.
TINY = {
    "mlp": {"proxy": (16, 1, 6, 4), "targets": {"2 T0, 2 B0": (32, 1, 12, 8)}, "num_lrs": 3},
    "gpt": {"proxy": (16, 2, 4, 2), "targets": {"2 T0, 2x depth": (16, 4, 8, 2)}, "num_lrs": 2},
}
#: Tokens per example (the docstring's: the MLP reads one next-byte target per example, the GPT 32 tokens).
SEQUENCE = {"mlp": 1, "gpt": 32}
CONTROL = ", at the proxy's size"  # the label of a control


def _flag(sizes):
    return ",".join(str(v) for v in sizes)


def test_recipe_mlp_and_gpt_account_and_regret(tmp_path):
    from benchmarks import recipe

    for model, opt in (("mlp", "mup_adamw"), ("gpt", "adamw_sp")):
        out = tmp_path / model
        preset = TINY[model]
        argv = [
            "--model",
            model,
            "--quick",
            "--optimizers",
            opt,
            "--out",
            str(out),
            "--no-progress",
            "--seeds",
            "1",
            "--proxy",
            _flag(preset["proxy"]),
            "--num-lrs",
            str(preset["num_lrs"]),
        ]
        argv += [f"--target={label}={_flag(v)}" for label, v in preset["targets"].items()]
        res = recipe.main(argv + (["--controls", "add"] if model == "mlp" else []))
        r = res[opt]
        if model == "mlp":  # the control: the target's steps and batch at the proxy's width, the same LR
            ((label, t), (clabel, c)) = r["targets"].items()
            assert clabel == label + CONTROL
            (w0, k0, _, _), (_, _, tt, bb) = preset["proxy"], preset["targets"][label]
            assert (c["scale"].width, c["scale"].depth, c["scale"].steps, c["scale"].batch_size) == (w0, k0, tt, bb)
            assert c["regret"]["full recipe"]["lr"] == pytest.approx(t["regret"]["full recipe"]["lr"], rel=1e-12)
            _, cruns = _seed_mean_min(out / "recipe.jsonl", name=opt, steps=tt, batch_size=bb, size=w0)
            assert len(cruns) >= preset["num_lrs"]
        else:
            ((label, t),) = r["targets"].items()
        (_, _, t0, b0), (w1, k1, t1, b1) = preset["proxy"], preset["targets"][label]
        seq = SEQUENCE[model]
        lr0 = r["proxy_lr"]
        hand = lr0 * ((t1 * b1 * seq) / (t0 * b0 * seq)) ** -0.32 * (b1 / b0) ** 0.62
        assert t["regret"]["full recipe"]["lr"] == pytest.approx(hand, rel=1e-9)
        assert t["regret"]["no batch"]["lr"] == pytest.approx(lr0 * (t1 * b1 / (t0 * b0)) ** -0.32, rel=1e-9)
        assert t["regret"]["no horizon"]["lr"] == pytest.approx(lr0 * (b1 / b0) ** 0.62, rel=1e-9)
        assert t["regret"]["naive"]["lr"] == pytest.approx(lr0, rel=1e-12)
        # reference='all': one best loss for every variant, the minimum over every LR the target ran
        name = opt if k1 in (1, 2) else f"{opt}/K{k1}"
        best, runs = _seed_mean_min(out / "recipe.jsonl", name=name, steps=t1, batch_size=b1, size=w1)
        for v in t["regret"].values():
            assert v["best_loss"] == pytest.approx(best, abs=1e-9) and v["regret"] >= -1e-12
        assert len(runs) >= preset["num_lrs"]  # the target's grid, plus the variants' LRs off it
        assert (out / f"recipe_recipe{'' if model == 'mlp' else '_gpt'}.png").exists()


#: ``--study wd``'s lambda grid (the docstring's): centred on the timescale ``tau = T0`` at the proxy's LR, 7 points.
WD_TAU_FRACTION, WD_POINTS = 1.0, 7


def test_weight_decay_study_rule_and_the_loss_without_decay(tmp_path):
    from benchmarks import recipe

    res = recipe.main(
        [
            "--study",
            "wd",
            "--optimizers",
            "adamw_sp",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--proxy",
            "16,1,5,4",
            "--multiples",
            "3",
            "--num-lrs",
            "3",
            "--seeds",
            "1",
            "--train-examples",
            "64",
        ]
    )["adamw_sp"]
    lr0, lam0 = res["proxy_lr"], res["proxy_lambda"]
    # the proxy's lambda grid is centred on tau = WD_TAU_FRACTION * T0 at the proxy's LR
    assert min(res["proxy_curve"], key=lambda g: abs(math.log(g * lr0 * 5 * WD_TAU_FRACTION))) == pytest.approx(
        1 / (WD_TAU_FRACTION * lr0 * 5), rel=1e-9
    )
    (t,) = res["targets"].values()
    lr1 = lr0 * 3**-st.HORIZON_EXPONENT
    assert t["learning_rate"] == pytest.approx(lr1, rel=1e-9)
    assert t["lambda"]["timescale rule"] == pytest.approx(lam0 * (lr0 * 5) / (lr1 * 15), rel=1e-9)
    assert t["lambda"]["naive"] == pytest.approx(lam0, rel=1e-12)
    grid = [
        lam
        for lam in t["curve"]
        if any(abs(lam - g) <= 1e-9 * g for g in lab.lr_grid(t["lambda"]["timescale rule"], WD_POINTS))
    ]
    assert len(grid) == WD_POINTS
    assert t["decay_gain"] == pytest.approx(t["no_decay_loss"] - min(t["curve"][g] for g in grid), abs=1e-9)
    runs = [json.loads(line) for line in open(tmp_path / "recipe.jsonl")]
    # the same number of epochs at every horizon: the target (3 T0, same batch) reads 3x the proxy's windows
    assert {r["data"] for r in runs} == {"text:pydoc[:64]", "text:pydoc[:192]"}
    assert {r["data"] for r in runs if r["steps"] == 15} == {"text:pydoc[:192]"}
    assert res["proxy_train_examples"] == 64 and t["train_examples"] == 192
    # the proxy's LR: the lowest seed-mean train loss of the no-decay LR sweep
    lr_runs = [r for r in runs if r["tag"] == "recipe-wd"]
    assert {r["steps"] for r in lr_runs} == {5} and len(lr_runs) == 3
    assert min(lr_runs, key=lambda r: r["train_loss"])["lr"] == pytest.approx(lr0, rel=1e-12)
    zero = [r for r in runs if r["lr"] == 0.0 and r["steps"] == 15]
    assert len(zero) == 1 and t["no_decay_loss"] == pytest.approx(zero[0]["val_loss"], abs=1e-9)
