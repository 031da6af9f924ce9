"""``transfer``'s account: ``muon``'s ``adam_b2`` goes through the beta2 rule; a weight decay of 0 stays 0 and is
listed as unchanged (not as a formula)."""

import pytest

from spectral_optax import transfer as st

PROXY = st.Scale(width=64, depth=2, steps=1000, batch_size=32, sequence_length=256)
TARGET = st.Scale(width=1024, depth=16, steps=20000, batch_size=128, sequence_length=256)


def test_adam_b2_takes_the_half_life_rule():
    t = st.transfer({"learning_rate": 3e-3, "adam_b2": 0.999, "b2": 0.95}, PROXY, TARGET)
    assert t["adam_b2"] == pytest.approx(0.999**4)
    assert t["b2"] == pytest.approx(0.95**4)


def test_zero_weight_decay_is_reported_unchanged():
    t = st.transfer({"learning_rate": 3e-3, "weight_decay": 0.0}, PROXY, TARGET)
    assert t["weight_decay"] == 0.0
    line = next(x for x in str(t).splitlines() if "weight_decay" in x)
    assert line.split() == ["-", "weight_decay", "0", "unchanged"]
    t = st.transfer({"learning_rate": 3e-3, "weight_decay": 0.1}, PROXY, TARGET)
    assert "->" in next(x for x in str(t).splitlines() if "weight_decay" in x)
