"""``lab.transfer_controls`` (benchmarks/recipe.py's ``--controls``): the target's horizon and batch at the proxy's
width and depth."""

from __future__ import annotations

import pytest

from spectral_optax import lab
from spectral_optax import transfer as st

SUFFIX = ", at the proxy's size"  # the label of a control, as the results name it


def _scale(w, k, t, b):
    return st.Scale(width=w, depth=k, steps=t, batch_size=b, sequence_length=1)


def test_controls_keep_horizon_and_batch_at_the_proxys_size():
    proxy = _scale(64, 2, 150, 32)
    targets = {
        "wide": _scale(512, 2, 1200, 128),
        "deep": _scale(64, 8, 600, 32),
        "same size": _scale(64, 2, 600, 64),  # no width or depth change: no control
    }
    added = lab.transfer_controls(proxy, targets, "add")
    assert list(added) == ["wide", "deep", "same size", "wide" + SUFFIX, "deep" + SUFFIX]
    assert added["wide" + SUFFIX] == _scale(64, 2, 1200, 128)
    assert added["deep" + SUFFIX] == _scale(64, 2, 600, 32)
    only = lab.transfer_controls(proxy, targets, "only")
    assert list(only) == ["wide" + SUFFIX, "deep" + SUFFIX]
    assert lab.transfer_controls(proxy, targets, "off") == targets and lab.CONTROL_SUFFIX == SUFFIX
    with pytest.raises(ValueError, match="controls"):
        lab.transfer_controls(proxy, targets, "some")
    # the control's transferred LR is the target's: width and depth are the parametrization's, not the recipe's
    lr = st.transfer({"learning_rate": 0.03}, proxy, targets["wide"])["learning_rate"]
    assert st.transfer({"learning_rate": 0.03}, proxy, added["wide" + SUFFIX])["learning_rate"] == lr
    assert lr == pytest.approx(0.03 * ((1200 * 128) / (150 * 32)) ** -0.32 * 4**0.62, rel=1e-12)
