"""spectral_optax.transfer: every rule's arithmetic against hand-computed values."""

import math

import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax import transfer as st

PROXY = st.Scale(width=64, depth=2, steps=1000, batch_size=32, sequence_length=128)
TARGET = st.Scale(width=512, depth=8, steps=8000, batch_size=128, sequence_length=128)
HP = {"learning_rate": 3e-3, "weight_decay": 0.1, "b2": 0.999, "b1": 0.9, "warmup_steps": 50}


def test_scale_tokens():
    assert PROXY.tokens == 1000 * 32 * 128
    assert st.Scale(steps=10).tokens is None


def test_horizon_rule_alone():
    t = st.transfer({"learning_rate": 0.01}, PROXY, TARGET, rules=[st.horizon()])
    # tokens grow 8 * 4 = 32x: 0.01 * 32^-0.32
    assert t["learning_rate"] == pytest.approx(0.01 * 32**-0.32, rel=1e-12)
    assert st.HORIZON_EXPONENT == 0.32
    t2 = st.transfer({"learning_rate": 0.01}, PROXY, TARGET, rules=[st.horizon(exponent=0.5)])
    assert t2["learning_rate"] == pytest.approx(0.01 / math.sqrt(32), rel=1e-12)


def test_batch_rule_alone_and_override():
    t = st.transfer({"learning_rate": 0.01}, PROXY, TARGET, rules=[st.batch()])
    assert t["learning_rate"] == pytest.approx(0.01 * 4**0.62, rel=1e-12)
    t2 = st.transfer({"learning_rate": 0.01}, PROXY, TARGET, rules={"batch": st.batch(0.5), "horizon": None})
    assert t2["learning_rate"] == pytest.approx(0.02, rel=1e-12)  # square-root rule: 4^0.5


def test_default_rules_full_account():
    t = st.transfer(HP, PROXY, TARGET)
    lr = 3e-3 * 32**-0.32 * 4**0.62
    assert t["learning_rate"] == pytest.approx(lr, rel=1e-12)
    assert t.lr_factor() == pytest.approx(lr / 3e-3, rel=1e-12)
    # weight decay: tau / T constant, with the transferred LR: 0.1 * (3e-3 * 1000) / (lr * 8000)
    assert t["weight_decay"] == pytest.approx(0.1 * 3e-3 * 1000 / (lr * 8000), rel=1e-12)
    tau0, tau1 = 1 / (3e-3 * 0.1), 1 / (t["learning_rate"] * t["weight_decay"])
    assert tau1 / 8000 == pytest.approx(tau0 / 1000, rel=1e-12)
    assert t["b2"] == pytest.approx(0.999**4, rel=1e-12)
    assert t["warmup_steps"] == 400.0
    assert t["b1"] == 0.9  # no rule: kept
    assert [f.rule for f in t.factors] == ["horizon", "batch", "weight_decay", "beta2", "warmup"]
    text = str(t)
    for needle in ("not applied", "2409.19913", "2510.03871", "2405.13698", "2507.07101", "b1", "unchanged"):
        assert needle in text
    # the horizon factor is listed with its value
    assert t.factors[0].factor == pytest.approx(32**-0.32, rel=1e-12)


def test_width_and_depth_are_never_applied():
    wide = st.Scale(width=4096, depth=64, steps=1000, batch_size=32, sequence_length=128)
    t = st.transfer(HP, PROXY, wide)
    assert t.hparams == pytest.approx(HP)


def test_equal_tokens_larger_batch():
    # 4x batch, 4x fewer steps: the horizon rule is neutral, the batch rule gives 4^0.62,
    # weight decay keeps eta * lambda * T: T falls 4x and eta grows 4^0.62
    tgt = st.Scale(steps=250, batch_size=128, sequence_length=128)
    t = st.transfer(HP, PROXY, tgt)
    assert t["learning_rate"] == pytest.approx(3e-3 * 4**0.62, rel=1e-12)
    assert t["weight_decay"] == pytest.approx(0.1 * 4 / 4**0.62, rel=1e-12)
    assert t["warmup_steps"] == pytest.approx(round(50 / 4))


def test_schedule_from_the_transferred_peak():
    t = st.transfer(HP, PROXY, TARGET)
    sched = t.warmup_cosine()
    peak, w = t["learning_rate"], 400
    assert float(sched(0)) == pytest.approx(0.0, abs=1e-12)
    assert float(sched(w)) == pytest.approx(peak, rel=1e-6)
    assert float(sched(8000)) == pytest.approx(0.0, abs=1e-9)
    mid = w + (8000 - w) // 2
    assert float(sched(mid)) == pytest.approx(peak * 0.5 * (1 + np.cos(np.pi * (mid - w) / (8000 - w))), rel=1e-5)
    # the schedule plugs into an optimizer
    tx = so.mup_adamw(sched, weight_decay=t["weight_decay"], b2=t["b2"])
    assert isinstance(tx, optax.GradientTransformation)


def test_custom_rule_appended():
    double = st.Rule("double", lambda hp0, hp, p, q: {"learning_rate": (2 * hp["learning_rate"], "x 2")}, "test")
    t = st.transfer({"learning_rate": 0.01}, PROXY, TARGET, rules={"double": double, "horizon": None, "batch": None})
    assert t["learning_rate"] == pytest.approx(0.02) and t.factors[-1].rule == "double"


@pytest.mark.parametrize(
    "hp, proxy, err, match",
    [
        ({"weight_decay": 0.1}, PROXY, ValueError, "learning_rate"),
        ({"learning_rate": -1.0}, PROXY, ValueError, "finite positive"),
        ({"learning_rate": float("nan")}, PROXY, ValueError, "finite positive"),
        ({"learning_rate": 0.1, "lr_embed": 2.0}, PROXY, ValueError, "unknown keys"),
        ({"learning_rate": optax.constant_schedule(0.1)}, PROXY, TypeError, "peak LR"),
        ({"learning_rate": 0.1}, st.Scale(width=64), ValueError, "horizon"),
        ({"learning_rate": 0.1, "b2": 1.5}, PROXY, ValueError, "b2"),
    ],
)
def test_bad_input(hp, proxy, err, match):
    with pytest.raises(err, match=match):
        st.transfer(hp, proxy, TARGET)


def test_bad_scale_and_rules():
    with pytest.raises(ValueError, match="Scale.steps"):
        st.Scale(steps=0)
    with pytest.raises(ValueError, match="Scale.batch_size"):
        st.Scale(batch_size=2.5)
    with pytest.raises(TypeError, match="Rule"):
        st.transfer({"learning_rate": 0.1}, PROXY, TARGET, rules=[lambda *a: {}])
    with pytest.raises(TypeError, match="Scale"):
        st.transfer({"learning_rate": 0.1}, {"steps": 1}, TARGET)


def test_transfer_weight_decay_zero_allowed_negative_refused():
    """weight_decay=0 passes the positivity check, a negative one raises naming hparams['weight_decay']."""
    proxy = st.Scale(width=64, depth=2, steps=1000, batch_size=32, sequence_length=128)
    target = st.Scale(width=512, depth=8, steps=8000, batch_size=128, sequence_length=128)
    out = st.transfer({"learning_rate": 0.01, "weight_decay": 0.0}, proxy, target)
    assert out is not None
    with pytest.raises(ValueError, match=r"hparams\['weight_decay'\] must be a finite positive number"):
        st.transfer({"learning_rate": 0.01, "weight_decay": -0.1}, proxy, target)


def test_horizon_rule_error_names_the_proxy():
    """The horizon rule without the proxy's tokens says the proxy needs steps and batch_size, and how to opt out."""
    target = st.Scale(width=512, depth=8, steps=8000, batch_size=128, sequence_length=128)
    rule = st.horizon()
    with pytest.raises(ValueError, match=r"'horizon' needs proxy's steps and batch_size.*rules=\{'horizon': None\}"):
        rule.fn({"learning_rate": 0.01}, {"learning_rate": 0.01}, st.Scale(width=64), target)
