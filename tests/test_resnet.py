"""The CIFAR-style ResNet (``spectral_optax.nn`` ResNet, Linen and NNX) and the augmented digits.

The forward pass is checked against a float64 NumPy ResNet written here
(explicit SAME-padded 3x3 convolutions, stride 2 between stages, pre-activation
blocks ``h + alpha f(h)``); conv-kernel geometry ``(window x in) -> out``
without overrides; the absorbed form against the explicit one after Muon
steps; a few training steps against the train and validation loss.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _nn_reference import f64 as _np
from _nn_reference import layer_norm as _ln
from _nn_reference import randomize as _randomize
from flax import nnx

import spectral_optax as so
from spectral_optax import lab
from spectral_optax.nn import linen as L
from spectral_optax.nn import nnx as N

C, K, CLASSES = 4, 2, 5


def _conv_same(x, w, b, stride=1):
    """NumPy 2-D convolution, TF/Flax 'SAME' padding (pad_lo = total // 2)."""
    n, hgt, wid, _ = x.shape
    kh, kw = w.shape[:2]
    out_h, out_w = -(-hgt // stride), -(-wid // stride)
    ph = max((out_h - 1) * stride + kh - hgt, 0)
    pw = max((out_w - 1) * stride + kw - wid, 0)
    xp = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    y = np.zeros((n, out_h, out_w, w.shape[-1]))
    for i in range(out_h):
        for j in range(out_w):
            patch = xp[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            y[:, i, j, :] = np.einsum("nabc,abcd->nd", patch, w)
    return y + b


def reference_resnet(p, x, alpha, num_blocks=K, stages=3):
    p = jax.tree_util.tree_map(_np, p)
    h = _conv_same(_np(x), p["conv_in"]["kernel"], p["conv_in"]["bias"])
    for s in range(stages):
        if s:
            h = _conv_same(h, p[f"conv_down_{s}"]["kernel"], p[f"conv_down_{s}"]["bias"], stride=2)
        for k in range(num_blocks):
            b = p[f"stage_{s}_blocks_{k}"]
            y = _conv_same(np.maximum(_ln(h, b["ln_0"]), 0), b["conv_0"]["kernel"], b["conv_0"]["bias"])
            y = _conv_same(np.maximum(_ln(y, b["ln_1"]), 0), b["conv_1"]["kernel"], b["conv_1"]["bias"])
            h = h + alpha * y
    h = np.maximum(_ln(h, p["ln_final"]), 0).mean((1, 2))
    return h @ p["head"]["kernel"] + p["head"]["bias"]


@functools.cache
def _x():
    return jax.random.normal(jax.random.key(7), (2, 6, 6, 1))


def _init(m):
    return m.init(jax.random.key(0), _x())["params"]


def test_linen_and_nnx_resnet_match_numpy_and_alpha_multiplies_every_block():
    m = L.ResNet(C, K, CLASSES)
    p = _randomize(_init(m))
    for alpha, expected in [(None, 2 / K), (1.0, 1.0), (0.3, 0.3)]:
        out = _np(L.ResNet(C, K, CLASSES, alpha=alpha).apply({"params": p}, _x()))  # eager: no compile
        assert out.shape == (2, CLASSES)
        np.testing.assert_allclose(out, reference_resnet(p, _x(), expected), rtol=1e-4, atol=1e-4)
    mn = N.ResNet(1, C, K, CLASSES, alpha=0.3, rngs=nnx.Rngs(1))
    pn = nnx.state(mn, nnx.Param).to_pure_dict()
    assert jax.tree_util.tree_map(jnp.shape, pn) == jax.tree_util.tree_map(jnp.shape, p)
    np.testing.assert_allclose(_np(mn(_x())), reference_resnet(pn, _x(), 0.3), rtol=1e-4, atol=1e-4)


def test_four_stages_match_numpy_linen_and_nnx():
    """The depth paper's block counts (4 stages of K: 8, 16, 32 blocks) in both APIs, against the reference."""
    m = L.ResNet(C, 1, CLASSES, num_stages=4)
    p = _randomize(_init(m))
    assert "conv_down_3" in p and "stage_3_blocks_0" in p and p["head"]["kernel"].shape == (8 * C, CLASSES)
    np.testing.assert_allclose(_np(m.apply({"params": p}, _x())), reference_resnet(p, _x(), 2.0, 1, 4),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    mn = N.ResNet(1, C, 1, CLASSES, num_stages=4, rngs=nnx.Rngs(1))
    pn = nnx.state(mn, nnx.Param).to_pure_dict()
    assert jax.tree_util.tree_map(jnp.shape, pn) == jax.tree_util.tree_map(jnp.shape, p)
    np.testing.assert_allclose(_np(mn(_x())), reference_resnet(pn, _x(), 2.0, 1, 4), rtol=1e-4, atol=1e-4)


def test_conv_geometry_inferred_without_override():
    m = L.ResNet(C, K, CLASSES)
    p = _init(m)
    by_name = dict(so.GeometryMap().leaves(p))
    assert by_name == dict(so.GeometryMap.from_linen(m, _x()).leaves(p))
    mn = N.ResNet(1, C, K, CLASSES, rngs=nnx.Rngs(0))
    assert by_name == dict(so.as_geometry_map(mn).leaves(nnx.state(mn, nnx.Param)))
    g = by_name["stage_2_blocks_1/conv_1/kernel"]
    assert (g.kind, g.d_in, g.d_out, g.batch_axes) == ("matrix", 9 * 4 * C, 4 * C, ())
    g = by_name["conv_down_1/kernel"]
    assert (g.d_in, g.d_out) == (9 * C, 2 * C)
    assert by_name["conv_in/kernel"].d_in == 9
    assert by_name["head/kernel"].role == "output"
    assert by_name["stage_0_blocks_0/ln_0/scale"].kind == "vector"
    chosen = sorted(k for k in by_name if __import__("re").search(so.nn.RESNET_BRANCH_OUT_PATTERN, k))
    assert len(chosen) == 2 * 3 * K and all("/conv_1/" in k for k in chosen)


@pytest.mark.slow
def test_absorbed_equals_explicit_after_muon_steps():
    pattern = so.nn.RESNET_BRANCH_OUT_PATTERN
    m, ma = L.ResNet(C, K, CLASSES), L.ResNet(C, K, CLASSES, absorbed=True)
    p = _init(m)
    pa = so.depth_scaled_init(p, K, mask=pattern)
    y = jnp.array([0, 3])

    def train(model, params, tx):
        def loss(q):
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": q}, _x()), y))

        def step(carry, _):
            q, state = carry
            u, state = tx.update(jax.grad(loss)(q), state, q)
            return (optax.apply_updates(q, u), state), None

        return jax.jit(lambda q: jax.lax.scan(step, (q, tx.init(q)), length=3)[0][0])(params)

    pe = train(m, p, so.muon(0.02))
    pab = train(ma, pa, optax.chain(so.muon(0.02), so.depth_residual_scale(K, mask=pattern)))
    np.testing.assert_allclose(_np(ma.apply({"params": pab}, _x())), _np(m.apply({"params": pe}, _x())),
                               rtol=2e-3, atol=2e-3)
    moved = _np(pe["stage_1_blocks_0"]["conv_1"]["kernel"]) - _np(p["stage_1_blocks_0"]["conv_1"]["kernel"])
    assert np.abs(moved).max() > 1e-3


def test_digits_augmented_split_and_statistics():
    d = lab.digits_augmented(copies=2)
    plain = lab.digits()
    assert d.input_shape == (10, 10, 1) and d.num_train == 2 * plain.num_train
    np.testing.assert_array_equal(d.val[1], plain.val[1])      # the same held-out digits
    np.testing.assert_array_equal(d.train[1][::2], plain.train[1])
    xt = _np(d.train[0])
    assert abs(xt.mean()) < 1e-4 and abs(xt.std() - 1) < 1e-4
    assert not np.allclose(xt[0], xt[1])                        # two different augmentations
    with pytest.raises(lab.DataError, match="copies"):
        lab.digits_augmented(copies=0)


@pytest.mark.slow
def test_training_lowers_train_and_val_loss():
    data = lab.digits_augmented(copies=2)
    xb, _ = data.numpy_batch("train", [0])
    model = lab.Model.from_linen(L.ResNet(8, 1, 10), xb, "xent")
    res = lab.sweep(lambda _: model, lambda lr: so.muon(lr), sizes=[1], lrs=[0.05], data=data,
                    steps=80, batch_size=32, eval_examples=128, progress=False)
    (run,) = res.runs
    # Margins measured 2026-12-01 (AMD EPYC, jax 0.10.2) over seeds 0-4 and XLA_FLAGS=--xla_cpu_max_isa=
    # SSE4_2 / AVX2 / default (this sweep with seeds=range(5)): the train-loss drop
    # initial - train was 0.48-1.26 (seed 0 the smallest: 0.479 / 0.479 / 0.502) and ln(10) - val 0.52-1.08.
    # The old 0.5 bars sat inside that spread (seed 0 failed on two instruction sets); 0.25 is half the smallest
    # measured drop, and still far from an untrained model (its loss stays at ln(10) ~ 2.30 or above).
    assert run["train_loss"] < run["initial_loss"] - 0.25
    assert run["val_loss"] < np.log(10) - 0.25
