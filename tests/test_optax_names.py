"""The named optimizers accept optax's argument names as aliases of their own (one vocabulary)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

PARAMS = {
    "Dense_0": {"kernel": jnp.linspace(-1.0, 1.0, 24).reshape(4, 6), "bias": jnp.linspace(0.0, 1.0, 6)},
    "Embed_0": {"embedding": jnp.linspace(-2.0, 2.0, 15).reshape(5, 3)},
}
MASK = {"Dense_0": {"kernel": True, "bias": True}, "Embed_0": {"embedding": False}}

# (optimizer, optax's names, the optimizer's own names): the same values, non-defaults.
CASES = {
    "muon": (
        so.muon,
        {"beta": 0.7, "ns_coeffs": "you", "preconditioning": "aol", "eps": 0.3, "mask": MASK},
        {"momentum": 0.7, "ns_coefficients": "you", "ns_preconditioning": "aol", "adam_eps": 0.3,
         "weight_decay_mask": MASK},
    ),
    "normuon": (
        so.normuon,
        {"beta": 0.7, "ns_coeffs": "you", "preconditioning": "aol", "mask": MASK},
        {"momentum": 0.7, "ns_coefficients": "you", "ns_preconditioning": "aol", "weight_decay_mask": MASK},
    ),
    "moga": (so.moga, {"beta": 0.7, "eps": 0.3, "mask": MASK}, {"momentum": 0.7, "adam_eps": 0.3,
                                                                "weight_decay_mask": MASK}),
    "mup_adamw": (so.mup_adamw, {"mask": MASK}, {"weight_decay_mask": MASK}),
    "mup_sgd": (so.mup_sgd, {"mask": MASK}, {"weight_decay_mask": MASK}),
    "spectral_sgd": (so.spectral_sgd, {"mask": MASK}, {"weight_decay_mask": MASK}),
    "rescaled_adamw": (so.rescaled_adamw, {"mask": MASK}, {"weight_decay_mask": MASK}),
}  # fmt: skip


def _two_steps(tx):
    state, p = tx.init(PARAMS), PARAMS
    for i in range(2):
        g = jax.tree.map(lambda x: jnp.cos(x * (i + 2)), PARAMS)
        u, state = tx.update(g, state, p)
        p = optax.apply_updates(p, u)
    return p


@pytest.mark.parametrize("name", sorted(CASES))
def test_optax_names_give_the_own_names_update(name):
    make, theirs, ours = CASES[name]
    wd = {"weight_decay": 0.1}
    a, b = _two_steps(make(0.05, **wd, **theirs)), _two_steps(make(0.05, **wd, **ours))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    # and the alias is wired: a different value changes the update
    alias, value = next(iter(theirs.items()))
    changed = {**theirs, alias: {"beta": 0.2, "mask": True}.get(alias, value)}
    c = _two_steps(make(0.05, **wd, **changed))
    assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_names_is_an_error_naming_both(name):
    make, theirs, ours = CASES[name]
    alias, own = next(iter(theirs)), next(iter(ours))
    with pytest.raises(TypeError, match=rf"'{own}'.*'{alias}'"):
        make(0.05, **{alias: theirs[alias], own: ours[own] if alias != "beta" else 0.5})
    assert alias in inspect.signature(make).parameters


def test_alias_under_inject_hyperparams():
    tx = optax.inject_hyperparams(so.muon)(learning_rate=0.05, beta=0.7)
    a, b = _two_steps(tx), _two_steps(so.muon(0.05, momentum=0.7))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_moga_routes_by_kind_with_muons_keywords():
    """One spelling of the kind routing: ``moga(embedding=..., vector=..., output=...)`` as ``muon``'s
    keywords ('adamw' is moga's 'adam'), equal to the same routing by path with ``rules=``."""
    by_kind = so.moga(0.05, embedding="adamw", vector="adam", output="row")
    by_path = so.moga(0.05, rules={r"embedding$": "adam", r"bias$": "adam", r"Dense_0/kernel$": "row"})
    for x, y in zip(jax.tree.leaves(_two_steps(by_kind)), jax.tree.leaves(_two_steps(by_path))):
        np.testing.assert_array_equal(x, y)
    default = _two_steps(so.moga(0.05))
    assert not np.array_equal(_two_steps(by_kind)["Dense_0"]["kernel"], default["Dense_0"]["kernel"])
    with pytest.raises(ValueError, match="embedding='normalize'"):
        so.moga(0.05, embedding="normalize")
