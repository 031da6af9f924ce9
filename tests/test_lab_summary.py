"""lab.exponent_summaries on synthetic sweeps with a known answer.

Each seed's loss is an exact parabola in log2(LR) with its minimum at ``c_seed * width ** s_seed`` (a grid
point), so the refined best LR, the fitted exponent of every seed and of the seed average, and the spread are
computed here in float64 from those choices.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spectral_optax import lab

WIDTHS = (32, 64, 128, 256)
GRID = [2.0**k for k in range(-12, 0)]  # factor-2 grid


def _runs(exponents, scale=1e-2):
    """Synthetic records: seed i's loss = 3 + 0.1 (log2 lr - log2 lr*_i(w))^2, lr*_i(w) on the grid."""
    runs = []
    for seed, s in enumerate(exponents):
        for w in WIDTHS:
            star = 2.0 ** round(math.log2(scale * (w / WIDTHS[0]) ** s))
            for lr in GRID:
                loss = 3.0 + 0.1 * (math.log2(lr) - math.log2(star)) ** 2
                runs.append({"size": w, "seed": seed, "lr": lr, "train_loss": loss, "val_loss": loss + 0.2,
                             "diverged": False})
    return runs


def _stars(s, scale=1e-2):
    return [2.0 ** round(math.log2(scale * (w / WIDTHS[0]) ** s)) for w in WIDTHS]


def _slope(ws, ys):
    x, y = np.log(np.asarray(ws, float)), np.log(np.asarray(ys, float))
    return float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())


def test_analyse_recovers_exponents_and_seed_interval():
    out = lab.exponent_summaries(_runs([-0.5, 0.0]), list(WIDTHS))
    for what in ("train", "val"):
        s = out[what]
        e0, e1 = _slope(WIDTHS, _stars(-0.5)), _slope(WIDTHS, _stars(0.0))
        assert s["exponent_per_seed"][0] == pytest.approx(e0, abs=1e-9)
        assert s["exponent_per_seed"][1] == pytest.approx(e1, abs=1e-9)
        assert s["exponent_interval"] == pytest.approx([min(e0, e1), max(e0, e1)], abs=1e-9)
        # Seed-averaged loss: the mean of two parabolas of equal curvature has its vertex at the
        # midpoint of the two minima in log2(lr) (inside half a grid step, so the refinement finds it).
        mid = [2.0 ** (0.5 * (math.log2(a) + math.log2(b))) for a, b in zip(_stars(-0.5), _stars(0.0))]
        np.testing.assert_allclose([s["best_lr"][w] for w in WIDTHS], mid, rtol=1e-9)
        assert s["exponent"] == pytest.approx(_slope(WIDTHS, mid), abs=1e-9)
        assert s["spread_steps"] == pytest.approx(math.log2(max(mid) / min(mid)), abs=1e-9)
        assert s["at_edge"] == []


def test_refine_minimum_all_diverged_and_tied_neighbour():
    """Every run diverged: (nan, -1); a right neighbour tied with the minimum puts the vertex at exactly +h/2."""
    best, i = lab.refine_minimum([1.0, 2.0, 4.0], [np.nan, np.inf, np.nan])
    assert math.isnan(best) and i == -1
    y = [6.369616873214543e-08, 4.097352393619469e-09, 4.097352393619469e-09]
    best, i = lab.refine_minimum([1.0, 2.0, 4.0], y)
    u = np.log(np.array([1.0, 2.0, 4.0]))
    h = 0.5 * (u[2] - u[0])
    assert i == 1 and best == float(np.exp(u[1] + h / 2))
