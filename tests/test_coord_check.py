"""Coordinate check (foundation issue, item 6).

A bias-free ReLU MLP trained for a few steps at widths 64..1024: under
``spectral_sgd`` and ``mup_sgd`` (Parametrization-1 init) the relative change
of each hidden layer's activations stays within 1.5x across widths, while
the standard parametrization with one learning rate grows.
"""

import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax import diagnostics as dg

WIDTHS = (64, 256, 1024)
SEEDS = (0, 1)


@pytest.mark.parametrize(
    "name, make",
    [
        ("spectral_sgd", lambda n: so.spectral_sgd(0.05)),
        ("mup_sgd", lambda n, base: so.mup_sgd(0.03, base=base)),
    ],
)
def test_mup_family_is_width_independent(name, make):
    r = dg.coord_check(make, WIDTHS, init="spectral", steps=3, seeds=SEEDS, name=name)
    assert r.widths == list(WIDTHS) and set(r.table) == {"h1", "h2", "out"}
    for layer in ("h1", "h2"):
        vals = np.asarray(r.table[layer])
        assert np.all(vals > 1e-4), (layer, vals)  # the features do move
        # max / min over widths, measured over 5 seed pairs x 2 ISAs (2026-12-01): 1.00-1.20; SP grows 1.9-35x.
        assert r.ratio(layer) <= 1.5, (name, layer, r.format())


def test_standard_parametrization_grows(tmp_path):
    r = dg.coord_check(optax.sgd(0.01), WIDTHS, init="standard", steps=3, seeds=SEEDS,
                       name="SP", plot=str(tmp_path / "cc.png"))
    # Growth from width 64 to 1024, measured 2026-12-01 over seed pairs (0,1), (2,3), ..., (8,9) on the default
    # ISA and SSE4_2: h1 1.91-6.87 (the old bar 2.0 failed on seeds (4,5)), h2 15.2-34.7; the muP family's
    # ratio in the test above stays at 1.00-1.20 on the same seeds. Bars at 0.6x the smallest measured growth.
    assert r.growth("h1") > 1.15, r.format()
    assert r.growth("h2") > 9.0, r.format()
    assert (tmp_path / "cc.png").stat().st_size > 1000


def test_zero_learning_rate_changes_nothing():
    r = dg.coord_check(optax.sgd(0.0), (16, 32), steps=2, seeds=(0,))
    assert all(v == 0.0 for vals in r.table.values() for v in vals)
    assert "h1" in r.format()
