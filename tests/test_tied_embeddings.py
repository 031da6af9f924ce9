"""Parametrization 1 on tied-embedding LMs: the initial loss does not grow with width (issue 35)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _lm_fixtures import TiedDecoder, UntiedDecoder
from _lm_fixtures_nnx import NNXDecoder
from flax import nnx

import spectral_optax as so

VOCAB = 256


def _tokens():
    return jax.random.randint(jax.random.key(1), (2, 16), 0, VOCAB)


def _loss(logits, tokens):
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    return float(-jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1)))


def _setup(cls, d):
    model = cls(d)
    x = _tokens()
    params = model.init(jax.random.key(0), x)["params"]
    geometry = so.GeometryMap.from_linen(model, x)
    return model, x, params, geometry


WIDTHS = [32, 128, pytest.param(512, marks=pytest.mark.slow)]


@pytest.mark.parametrize("d", WIDTHS)
def test_tied_initial_loss_is_ln_vocab_with_the_readout_multiplier(d):
    model, x, params, geometry = _setup(TiedDecoder, d)
    params = so.initializers.reinitialize(jax.random.key(2), params, geometry)
    m = so.initializers.tied_readout_multiplier(params, geometry)
    assert m == pytest.approx(1.0 / d)
    with so.initializers.tied_readout(m):
        loss = _loss(model.apply({"params": params}, x), x)
    assert abs(loss - math.log(VOCAB)) < 0.5


def test_tied_without_the_multiplier_grows_with_width():
    # The failure the multiplier fixes: N(0, 1) lookup entries read out unscaled.
    model, x, params, geometry = _setup(TiedDecoder, 128)
    params = so.initializers.reinitialize(jax.random.key(2), params, geometry)
    assert _loss(model.apply({"params": params}, x), x) > math.log(VOCAB) + 5.0


@pytest.mark.parametrize("d", WIDTHS)
def test_untied_initial_loss_after_reinitialize(d):
    model, x, params, geometry = _setup(UntiedDecoder, d)
    # The untied head meets the spectral condition (logits of Theta(1) size): the bound is the
    # issue's "within 0.5 nats of ln(vocab) or of the default init's".
    default = _loss(model.apply({"params": params}, x), x)
    params = so.initializers.reinitialize(jax.random.key(2), params, geometry)
    loss = _loss(model.apply({"params": params}, x), x)
    assert loss < max(math.log(VOCAB), default) + 0.5


def test_readout_multiplier_scales_attend_exactly():
    # Independent float64 reference: logits = m * LayerNorm(h) @ E^T, computed in NumPy.
    table = np.random.default_rng(0).normal(size=(11, 8))
    q = np.random.default_rng(1).normal(size=(3, 8))
    emb = nn.Embed(11, 8, param_dtype=jnp.float32)
    variables = {"params": {"embedding": jnp.asarray(table, jnp.float32)}}
    with so.initializers.tied_readout(0.25):
        got = emb.apply(variables, jnp.asarray(q, jnp.float32), method=nn.Embed.attend)
        looked = emb.apply(variables, jnp.asarray([3]))
    np.testing.assert_allclose(np.asarray(got), 0.25 * q @ table.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(looked), table[[3]], rtol=1e-6)  # the lookup is left alone


def test_bad_input_errors():
    model, x, params, geometry = _setup(UntiedDecoder, 32)
    with pytest.raises(ValueError, match="no tied embedding table"):
        so.initializers.tied_readout_multiplier(params, geometry)
    with pytest.raises(ValueError, match="multiplier"):
        with so.initializers.tied_readout(float("nan")):
            pass


# --------------------------------------------------------------------------
# NNX: tied_readout_nnx on a live model.
# --------------------------------------------------------------------------
def _nnx_setup(d, tied=True):
    model = NNXDecoder(d, tied=tied, rngs=nnx.Rngs(0))
    x = _tokens()
    geometry = so.GeometryMap.from_nnx(model, x)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, so.initializers.reinitialize(jax.random.key(2), params, geometry))
    return model, x, params, geometry


@pytest.mark.parametrize(
    "d", [32, pytest.param(128, marks=pytest.mark.slow), pytest.param(512, marks=pytest.mark.slow)]
)
def test_nnx_tied_initial_loss_is_ln_vocab_with_the_readout_multiplier(d):
    model, x, params, geometry = _nnx_setup(d)
    unfixed = _loss(model(x), x)
    assert unfixed > math.log(VOCAB) + 5.0  # N(0, 1) entries read out unscaled: sqrt(d)-sized logits
    m = so.initializers.tied_readout_multiplier(params, geometry)
    assert m == pytest.approx(1.0 / d)
    assert so.initializers.tied_readout_nnx(model, m) is model
    assert abs(_loss(model(x), x) - math.log(VOCAB)) < 0.5
    # the factor is static: it survives split / merge and nnx.jit
    again = nnx.merge(*nnx.split(model))
    assert abs(_loss(nnx.jit(lambda mod, t: mod(t))(again, x), x) - math.log(VOCAB)) < 0.5


def test_tied_readout_nnx_scales_attend_exactly():
    # Independent float64 reference: attend(q) = m * q @ E^T, the lookup unchanged, the multiplier set (not compounded).
    table = np.random.default_rng(0).normal(size=(11, 8))
    q = np.random.default_rng(1).normal(size=(3, 8))

    class Holder(nnx.Module):
        def __init__(self):
            self.emb = nnx.Embed(11, 8, rngs=nnx.Rngs(0))
            self.alias = self.emb  # one table, two parents: both see the factor

    model = Holder()
    model.emb.embedding[...] = jnp.asarray(table, jnp.float32)
    paths = sorted(dict(nnx.to_flat_state(nnx.state(model, nnx.Param))))
    so.initializers.tied_readout_nnx(model, 0.5)
    so.initializers.tied_readout_nnx(model, 0.25)
    assert model.alias is model.emb and isinstance(model.emb, nnx.Embed)
    np.testing.assert_allclose(np.asarray(model.alias.attend(jnp.asarray(q))), 0.25 * q @ table.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model.emb(jnp.asarray([3]))), table[[3]], rtol=1e-6)
    assert sorted(dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))) == paths  # the state is unchanged
    # gradients through the read-out carry the factor (chain rule): d/dE sum(attend(q)) = m * 1 q-sum
    grad = nnx.grad(lambda mod: mod.emb.attend(jnp.asarray(q)).sum())(model)
    (g,) = jax.tree.leaves(grad)
    np.testing.assert_allclose(np.asarray(g), 0.25 * np.tile(q.sum(0), (11, 1)), rtol=1e-5, atol=1e-5)


def test_nnx_bad_input_errors():
    class NoTable(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    with pytest.raises(ValueError, match="no flax.nnx.Embed in NoTable"):
        so.initializers.tied_readout_nnx(NoTable(), 0.5)
    with pytest.raises(ValueError, match="multiplier must be a finite number"):
        so.initializers.tied_readout_nnx(NoTable(), 0.0)
    with pytest.raises(ValueError, match="live flax.nnx.Module"):
        so.initializers.tied_readout_nnx({"embedding": jnp.ones((3, 2))}, 0.5)


def test_describe_notes_the_tied_readout(capsys):
    # The tied table's row carries the multiplier 1/d (here 1/64, written out) and names the fix; printed too.
    _, _, params, geometry = _setup(TiedDecoder, 64)
    rows = {r["path"]: r for r in so.describe(params, geometry)}
    note = rows["embed/embedding"]["note"]
    assert "0.01562" in note and "tied_readout(m)" in note and "tied_readout_nnx(model, m)" in note
    assert [p for p, r in rows.items() if r["note"]] == ["embed/embedding"]
    assert "note: embed/embedding is a tied table" in capsys.readouterr().out
    _, _, params, geometry = _setup(UntiedDecoder, 64)
    assert not any(r["note"] for r in so.describe(params, geometry))
    assert "note:" not in capsys.readouterr().out
