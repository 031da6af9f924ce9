"""benchmarks/tied_transfer.py's code path, a few steps (the benchmark itself: docs/benchmarks.md)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import spectral_optax as so
from benchmarks import tied_transfer
from spectral_optax import lab


def test_models_start_at_ln_vocab_and_the_tied_one_carries_the_multiplier():
    # The benchmark's 'spectral' tied model is reinitialize + tied_readout(1/d): its initial loss is the uniform
    # predictor's ln(256) (reference computed here); the same params read out without the multiplier are far above.
    data = lab.load("text", context=8, sequence=True)
    x, y = data.numpy_batch("train", np.arange(4))
    model, geometry = tied_transfer.make_model(64, data, tied=True, init="spectral")
    params = model.init(jax.random.key(0))
    assert abs(float(model.loss(params, x, y)) - math.log(256)) < 0.5
    own, _ = tied_transfer.make_model(64, data, tied=True, init="own")
    assert float(own.loss(params, x, y)) > math.log(256) + 3.0
    notes = [r["path"] for r in so.describe(params, geometry, print_table=False) if r["note"]]
    assert notes == ["embed/embedding"]


@pytest.mark.slow
def test_quick_code_path_runs_and_reports(tmp_path):
    report = tied_transfer.run(
        models=("tied",),
        optimizers=("muon", "adamw_sp"),
        widths=[16, 32],
        num_lrs=2,
        steps=2,
        seeds=[0],
        context=8,
        batch_size=2,
        out=str(tmp_path),
        progress=False,
    )
    s = report["tied"]["summary"]
    assert set(s) == {"muon", "adamw_sp"}
    for name in s:
        assert sorted(s[name]["loss_at_best"]) == [16, 32]
        assert all(math.isfinite(v) for v in s[name]["loss_at_best"].values())
        assert report["tied"]["regret"][name]["wide"] == 32
    assert (tmp_path / "tied_transfer.jsonl").exists()
    tied_transfer.print_report(report, [16, 32])
