"""Parametrization 1 never gives an init whose loss grows with width (issue 35, every fixture family).

For each family, at widths 32 to 512: the loss at the model's own (Flax default)
init, then after ``so.initializers.reinitialize`` with the geometry traced from
the model (and, for a tied read-out, ``tied_readout`` / ``tied_readout_nnx``
with ``tied_readout_multiplier``). The reference is the uniform predictor's
cross-entropy ``ln(classes)``, computed here from the class count (labels are
drawn uniformly, independent of the input, so no predictor beats it in
expectation): the loss after ``reinitialize`` must be within 0.5 nats of it, or
of the default init's loss. Two widths are fast; the full range is slow.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from _lm_fixtures import TiedDecoder, UntiedDecoder
from _lm_fixtures_nnx import NNXDecoder
from _vit_fixture import ViT
from flax import nnx

import spectral_optax as so
from spectral_optax.lab import MLP

VOCAB, CLASSES = 256, 10


def _xent(logits, labels):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return float(-jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1)))


def _lm_batch():
    tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, VOCAB)
    return tokens[:, :-1], tokens[:, 1:], VOCAB


def _image_batch():
    x = jax.random.normal(jax.random.key(1), (16, 16, 16, 3))
    return x, jax.random.randint(jax.random.key(3), (16,), 0, CLASSES), CLASSES


def _linen(make, batch):
    """``(default_loss, reinit_loss, unfixed_loss)`` of a Linen model; unfixed: a tied model without the multiplier."""

    def run(d):
        x, y, n = batch()
        model = make(d)
        params = model.init(jax.random.key(0), x)["params"]
        default = _xent(model.apply({"params": params}, x), y)
        geometry = so.GeometryMap.from_linen(model, x)
        params = so.initializers.reinitialize(jax.random.key(2), params, geometry)
        unfixed = _xent(model.apply({"params": params}, x), y)
        if any(r["kind"] == "embedding/output" for r in so.describe(params, geometry, print_table=False)):
            with so.initializers.tied_readout(so.initializers.tied_readout_multiplier(params, geometry)):
                return default, _xent(model.apply({"params": params}, x), y), unfixed, n
        return default, unfixed, unfixed, n

    return run


def _nnx(make, batch):
    def run(d):
        x, y, n = batch()
        model = make(d)
        default = _xent(model(x), y)
        geometry = so.GeometryMap.from_nnx(model, x)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, so.initializers.reinitialize(jax.random.key(2), params, geometry))
        unfixed = _xent(model(x), y)
        if any(r["kind"] == "embedding/output" for r in so.describe(params, geometry, print_table=False)):
            so.initializers.tied_readout_nnx(model, so.initializers.tied_readout_multiplier(params, geometry))
            return default, _xent(model(x), y), unfixed, n
        return default, unfixed, unfixed, n

    return run


class _FlatMLP(nn.Module):
    """The lab MLP on images, Flax's default init (``parametrization='standard'``)."""

    width: int
    residual: bool = False

    @nn.compact
    def __call__(self, x):
        return MLP(self.width, depth=2, num_outputs=CLASSES, residual=self.residual, parametrization="standard")(x)


class _FlatResidualMLP(nn.Module):
    """``so.nn.linen.ResidualMLP`` on flattened images."""

    width: int

    @nn.compact
    def __call__(self, x):
        return so.nn.linen.ResidualMLP(self.width, 2, CLASSES, name="net")(x.reshape(x.shape[0], -1))


FAMILIES = {
    "linen_tied_lm": (_linen(TiedDecoder, _lm_batch), True),
    "linen_untied_lm": (_linen(UntiedDecoder, _lm_batch), False),
    "nnx_tied_lm": (_nnx(lambda d: NNXDecoder(d, rngs=nnx.Rngs(0)), _lm_batch), True),
    "nnx_untied_lm": (_nnx(lambda d: NNXDecoder(d, tied=False, rngs=nnx.Rngs(0)), _lm_batch), False),
    "linen_gpt": (_linen(lambda d: so.nn.linen.Transformer(VOCAB, d, 2, d // 16, max_len=16), _lm_batch), False),
    "nnx_gpt": (
        _nnx(lambda d: so.nn.nnx.Transformer(VOCAB, d, 2, d // 16, max_len=16, rngs=nnx.Rngs(0)), _lm_batch),
        False,
    ),
    "vit": (_linen(ViT, _image_batch), False),
    "mlp": (_linen(_FlatMLP, _image_batch), False),
    "residual_mlp": (_linen(lambda d: _FlatMLP(d, residual=True), _image_batch), False),
    "nn_residual_mlp": (_linen(_FlatResidualMLP, _image_batch), False),
}
# Fast: three cheap cases of families tests/test_tied_embeddings.py does not run fast.
FAST = {("nnx_untied_lm", 32), ("vit", 32), ("mlp", 512)}
CASES = [
    pytest.param(f, d, id=f"{f}-{d}", marks=() if (f, d) in FAST else pytest.mark.slow)
    for f in FAMILIES
    for d in (32, 64, 128, 256, 512)
]


@pytest.mark.parametrize("family, d", CASES)
def test_initial_loss_after_reinitialize_does_not_grow_with_width(family, d):
    run, _ = FAMILIES[family]
    default, loss, _, n = run(d)
    assert math.isfinite(loss)
    assert abs(loss - math.log(n)) < 0.5 or abs(loss - default) < 0.5, (family, d, default, loss, math.log(n))


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f, (_, tied) in FAMILIES.items() if tied])
def test_tied_families_need_the_fix(family):
    # The test above is not vacuous: without the read-out multiplier the tied loss is far above ln(vocab)
    # and grows with the width (sqrt(d)-sized logits at init).
    run, _ = FAMILIES[family]
    unfixed = [run(d)[2] for d in (32, 128)]
    assert unfixed[0] > math.log(VOCAB) + 5.0
    assert unfixed[1] > 2.0 * unfixed[0]
