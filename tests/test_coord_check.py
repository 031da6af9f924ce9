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
        assert r.ratio(layer) <= 1.5, (name, layer, r.format())


def test_standard_parametrization_grows(tmp_path):
    r = dg.coord_check(optax.sgd(0.01), WIDTHS, init="standard", steps=3, seeds=SEEDS,
                       name="SP", plot=str(tmp_path / "cc.png"))
    for layer in ("h1", "h2"):
        assert r.growth(layer) > 2.0, r.format()
    assert (tmp_path / "cc.png").stat().st_size > 1000


def test_zero_learning_rate_changes_nothing():
    r = dg.coord_check(optax.sgd(0.0), (16, 32), steps=2, seeds=(0,))
    assert all(v == 0.0 for vals in r.table.values() for v in vals)
    assert "h1" in r.format()
