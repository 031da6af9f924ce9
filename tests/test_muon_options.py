"""``so.muon``'s options that must reach their routes: ``output=`` and a weight-decay mask given as a tree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


@pytest.mark.usefixtures("highest_precision")
def test_muon_output_route_takes_only_the_head():
    """``output='adamw'``: the head's matrix gets AdamW's first step ``-lr g / (|g| + eps)``
    (float64), the hidden matrix still gets Muon (not that step)."""
    rng = np.random.default_rng(11)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((6, 8))}, "head": {"kernel": rng.standard_normal((8, 3))}})
    g = f32({"Dense_0": {"kernel": rng.standard_normal((6, 8))}, "head": {"kernel": rng.standard_normal((8, 3))}})
    tx = so.muon(0.1, output="adamw")
    u, _ = tx.update(g, tx.init(params), params)
    adam_step = lambda x: -0.1 * np.asarray(x, np.float64) / (np.abs(np.asarray(x, np.float64)) + 1e-8)
    np.testing.assert_allclose(np.asarray(u["head"]["kernel"]), adam_step(g["head"]["kernel"]), rtol=1e-5)
    assert not np.allclose(np.asarray(u["Dense_0"]["kernel"]), adam_step(g["Dense_0"]["kernel"]), rtol=1e-2)


@pytest.mark.usefixtures("highest_precision")
def test_muon_weight_decay_mask_as_a_tree():
    """A tree of bools as ``weight_decay_mask``: the masked leaves' updates differ from the
    undecayed ones by exactly ``-lr * weight_decay * W``, the others not at all."""
    rng = np.random.default_rng(12)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((6, 8)), "bias": rng.standard_normal(8)},
                  "Dense_1": {"kernel": rng.standard_normal((8, 4))}})
    g = jax.tree.map(lambda x: x * 0.5 + 0.1, params)
    mask = {"Dense_0": {"kernel": True, "bias": True}, "Dense_1": {"kernel": False}}
    lr, wd = 0.1, 0.5
    decayed = so.muon(lr, weight_decay=wd, adam_weight_decay=wd, weight_decay_mask=mask)
    plain = so.muon(lr)
    u, _ = decayed.update(g, decayed.init(params), params)
    v, _ = plain.update(g, plain.init(params), params)
    for path, m in (("Dense_0/kernel", True), ("Dense_0/bias", True), ("Dense_1/kernel", False)):
        a, b = path.split("/")
        diff = np.asarray(u[a][b], np.float64) - np.asarray(v[a][b], np.float64)
        want = -lr * wd * np.asarray(params[a][b], np.float64) if m else np.zeros(params[a][b].shape)
        np.testing.assert_allclose(diff, want, rtol=1e-4, atol=1e-6, err_msg=path)
