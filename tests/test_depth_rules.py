"""Depth rules side by side: the residual-scale exponent ``a`` and its companion learning rate.

``alpha = (K_base / K) ** a`` (a = 1 inverse depth, a = 1/2 Depth-muP) in
``residual_alpha``, ``depth_residual_scale``, ``depth_scaled_init`` and the
``so.nn`` models; ``depth_lr_multiplier`` / ``depth_lr_scale`` give the block
parameters' learning rate ``(K_base / K) ** (1 - a)`` (scale invariant) or
``(K_base / K) ** (1 - 2 a)`` (SGD), docs/math.md section 5. Every number is
checked against a float64 value written here (``math`` powers, the NumPy
forwards of ``test_nn`` / ``test_gpt``), never against the package's output.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _nn_reference import f64 as _np
from _nn_reference import randomize as _randomize
from flax import nnx
from test_gpt import reference_gpt
from test_nn import reference_residual_mlp

import spectral_optax as so
from spectral_optax.nn import linen as L
from spectral_optax.nn import nnx as N

pytestmark = pytest.mark.usefixtures("highest_precision")


@pytest.mark.parametrize("k,base,a", [(8, 2, 1.0), (8, 2, 0.5), (64, 2, 0.5), (12, 3, 0.25), (5, 2, 0.0)])
def test_residual_alpha_is_the_power(k, base, a):
    expected = math.exp(a * (math.log(base) - math.log(k)))  # float64 reference
    assert so.residual_alpha(k, base, exponent=a) == pytest.approx(expected, rel=1e-12)
    # the explicit multiplier still wins
    assert so.residual_alpha(k, base, alpha=0.7, exponent=a) == 0.7


@pytest.mark.parametrize(
    "k,a,kind,expected",
    [
        (8, 1.0, "scale_invariant", 1.0),  # inverse depth: no correction
        (8, 0.5, "scale_invariant", 0.5),  # Depth-muP, Adam-like: sqrt(2 / 8)
        (32, 0.5, "scale_invariant", 0.25),
        (8, 0.0, "scale_invariant", 0.25),  # unscaled branches: LR ~ 1 / K
        (8, 0.5, "sgd", 1.0),  # Depth-muP, SGD: constant
        (8, 1.0, "sgd", 4.0),  # inverse depth with plain SGD: LR ~ K
    ],
)
def test_depth_lr_multiplier_exact(k, a, kind, expected):
    assert so.expert.depth_lr_multiplier(k, 2, exponent=a, optimizer_kind=kind) == pytest.approx(expected, rel=1e-12)


def test_bad_exponent_and_kind_are_named():
    for bad in (-0.5, float("nan"), float("inf"), "half", None):
        with pytest.raises(ValueError, match="exponent"):
            so.residual_alpha(8, exponent=bad)
    with pytest.raises(ValueError, match="exponent"):
        so.depth_residual_scale(8, exponent=-1.0)
    with pytest.raises(ValueError, match="exponent"):
        so.depth_lr_scale(8, exponent=float("nan"))
    with pytest.raises(ValueError, match="optimizer_kind"):
        so.expert.depth_lr_multiplier(8, exponent=0.5, optimizer_kind="adam")
    with pytest.raises(ValueError, match="exponent"):
        L.ResidualMLP(8, 4, 3, exponent=-2.0).branch_alpha


def _toy_params(prefix="blocks"):
    return {
        "embed": {"embedding": jnp.ones((7, 4))},
        prefix: {
            "dense_0": {"kernel": jnp.ones((5, 4, 4)), "bias": jnp.ones((5, 4))},
            "dense_1": {"kernel": jnp.ones((5, 4, 4)), "bias": jnp.ones((5, 4))},
            "ln_mlp": {"scale": jnp.ones((5, 4))},
        },
        "ln_final": {"scale": jnp.ones((4,))},
        "head": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones((2,))},
    }


def _factors(tx, params):
    """The factor each leaf's update was multiplied by (gradient 3 everywhere)."""
    grads = jax.tree_util.tree_map(lambda x: 3.0 * x, params)
    out, _ = tx.update(grads, tx.init(params), params)
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(u, np.float64) / 3.0
        for path, u in jax.tree_util.tree_flatten_with_path(out)[0]
    }


@pytest.mark.parametrize("prefix", ["blocks", "blocks_3", "stage_1_blocks_0"])
@pytest.mark.parametrize("a,kind", [(0.5, "scale_invariant"), (0.0, "scale_invariant"), (1.0, "sgd")])
def test_depth_lr_scale_multiplies_every_block_parameter_only(prefix, a, kind):
    params = _toy_params(prefix)
    k = 5
    power = (1 - a) if kind == "scale_invariant" else (1 - 2 * a)
    factor = (2 / k) ** power
    for name, f in _factors(so.depth_lr_scale(k, exponent=a, optimizer_kind=kind), params).items():
        expected = factor if name.startswith(prefix + "/") else 1.0
        np.testing.assert_allclose(f, expected, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("a", [0.5, 0.25])
def test_depth_residual_scale_uses_the_exponent(a):
    params = _toy_params()
    k = 8
    alpha = (2 / k) ** a
    for kind, factor in (("scale_invariant", alpha), ("sgd", alpha**2)):
        out = _factors(so.depth_residual_scale(k, exponent=a, optimizer_kind=kind), params)
        for name, f in out.items():
            expected = factor if name.startswith("blocks/dense_1/") else 1.0
            np.testing.assert_allclose(f, expected, rtol=1e-6, err_msg=f"{kind} {name}")


def test_depth_lr_scale_mask_selecting_nothing_names_paths():
    with pytest.raises(so.GeometryError, match="encoder/kernel"):
        so.depth_lr_scale(4, exponent=0.5).init({"encoder": {"kernel": jnp.ones((3, 3))}})


# --------------------------------------------------------------------------
# Models: the branch multiplier (2 / K) ** a against the float64 forwards.
# --------------------------------------------------------------------------
K, WIDTH, D_IN, D_OUT = 8, 8, 5, 3


def _x():
    return jax.random.normal(jax.random.key(7), (6, D_IN))


@pytest.mark.parametrize("a", [0.5, 0.0])
def test_linen_and_nnx_residual_mlp_exponent_matches_numpy(a):
    alpha = (2.0 / K) ** a
    m = L.ResidualMLP(WIDTH, K, D_OUT, exponent=a)
    assert m.branch_alpha == pytest.approx(alpha, rel=1e-12)
    p = _randomize(jax.jit(m.init)(jax.random.key(0), _x())["params"])
    out = _np(jax.jit(m.apply)({"params": p}, _x()))
    np.testing.assert_allclose(out, reference_residual_mlp(p, _x(), alpha), rtol=2e-5, atol=2e-5)
    # a wrong exponent would be visible: the reference at a = 1 differs
    assert np.abs(out - reference_residual_mlp(p, _x(), 2.0 / K)).max() > 1e-2
    mn = N.ResidualMLP(D_IN, WIDTH, K, D_OUT, exponent=a, rngs=nnx.Rngs(0))
    assert mn.branch_alpha == pytest.approx(alpha, rel=1e-12)
    new = _randomize(nnx.state(mn, nnx.Param))
    nnx.update(mn, new)
    np.testing.assert_allclose(_np(mn(_x())), reference_residual_mlp(nnx.to_pure_dict(new), _x(), alpha),
                               rtol=2e-5, atol=2e-5)


def test_linen_and_nnx_transformer_exponent_matches_numpy():
    v, d, h, k, t = 13, 16, 2, 3, 6
    tokens = jax.random.randint(jax.random.key(2), (2, t), 0, v)
    alpha = math.sqrt(2.0 / k)
    m = L.Transformer(v, d, k, num_heads=h, max_len=8, qkv="fused", exponent=0.5)
    assert m.branch_alpha == pytest.approx(alpha, rel=1e-12)
    p = _randomize(jax.jit(m.init)(jax.random.key(0), tokens)["params"])
    out = _np(jax.jit(m.apply)({"params": p}, tokens))
    np.testing.assert_allclose(out, reference_gpt(p, tokens, alpha, num_blocks=k), rtol=1e-4, atol=1e-4)
    mn = N.Transformer(v, d, k, h, max_len=8, qkv="fused", exponent=0.5, rngs=nnx.Rngs(1))
    assert mn.branch_alpha == pytest.approx(alpha, rel=1e-12)
    params = nnx.state(mn, nnx.Param).to_pure_dict()
    np.testing.assert_allclose(_np(nnx.jit(lambda mod, x: mod(x))(mn, tokens)),
                               reference_gpt(params, tokens, alpha, num_blocks=k), rtol=1e-4, atol=1e-4)


def test_resnet_exponent_sets_the_multiplier():
    assert L.ResNet(4, K, 10, exponent=0.5).branch_alpha == pytest.approx(0.5, rel=1e-12)  # sqrt(2 / 8)
    mn = N.ResNet(3, 4, K, 10, exponent=0.5, rngs=nnx.Rngs(0))
    assert mn.branch_alpha == pytest.approx(0.5, rel=1e-12)


# --------------------------------------------------------------------------
# Absorbed = explicit for a = 1/2, trained with the companion learning rate.
# --------------------------------------------------------------------------
def _train(model, params, tx, steps=15):
    x = _x()
    y = jax.random.normal(jax.random.key(3), (6, D_OUT))

    def loss(p):
        return 0.5 * jnp.mean((model.apply({"params": p}, x) - y) ** 2)

    @jax.jit
    def run(p):
        def step(carry, _):
            p, s = carry
            u, s = tx.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, u), s), None

        (p, _), _ = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
        return model.apply({"params": p}, x)

    return _np(run(params))


def test_absorbed_depth_mup_matches_explicit_with_companion_lr():
    """Depth-muP, explicit: h + sqrt(2/K) f(h), spectral SGD with block LR sqrt(2/K). Absorbed: unit
    multipliers, dense_1 init and updates times sqrt(2/K), same companion LR: the same outputs."""
    a, lr = 0.5, 0.05
    explicit = L.ResidualMLP(WIDTH, K, D_OUT, exponent=a)
    absorbed = L.ResidualMLP(WIDTH, K, D_OUT, exponent=a, absorbed=True)
    p_exp = jax.jit(explicit.init)(jax.random.key(0), _x())["params"]
    p_abs = so.depth_scaled_init(p_exp, K, exponent=a)
    np.testing.assert_allclose(_np(p_abs["blocks"]["dense_1"]["kernel"]),
                               0.5 * _np(p_exp["blocks"]["dense_1"]["kernel"]), rtol=1e-6)
    tx_exp = optax.chain(so.spectral_sgd(lr), so.depth_lr_scale(K, exponent=a))
    tx_abs = optax.chain(so.spectral_sgd(lr), so.depth_residual_scale(K, exponent=a),
                         so.depth_lr_scale(K, exponent=a))
    out_e, out_a = _train(explicit, p_exp, tx_exp), _train(absorbed, p_abs, tx_abs)
    np.testing.assert_allclose(out_a, out_e, rtol=1e-4, atol=1e-4 * np.abs(out_e).max())
    # negative control: the exponent-1 transform (alpha = 1/4, not 1/2) breaks the equivalence
    wrong = optax.chain(so.spectral_sgd(lr), so.depth_residual_scale(K), so.depth_lr_scale(K, exponent=a))
    assert np.linalg.norm(_train(absorbed, p_abs, wrong) - out_e) > 1e-2 * np.linalg.norm(out_e)


def test_benchmark_depth_mup_form_scales_block_updates_only():
    """lab.depth.form_factory('depth_mup'): the optimizer's update with the block leaves times
    sqrt(2 / K); the scaled and unscaled forms use the optimizer as is."""
    from spectral_optax.lab import depth as bench

    params = _toy_params()
    grads = jax.tree_util.tree_map(lambda x: x * jnp.arange(1.0, x.size + 1).reshape(x.shape) / x.size, params)
    plain = optax.adamw(0.01, weight_decay=0.0)
    ref, _ = plain.update(grads, plain.init(params), params)
    for form, factor in (("depth_mup", math.sqrt(2 / 8)), ("scaled", 1.0)):
        tx = bench.form_factory("adamw", form)
        tx = tx(0.01, 8) if form == "depth_mup" else tx(0.01)
        out, _ = tx.update(grads, tx.init(params), params)
        for (path, u), r in zip(jax.tree_util.tree_flatten_with_path(out)[0], jax.tree_util.tree_leaves(ref)):
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            f = factor if name.startswith("blocks/") else 1.0
            np.testing.assert_allclose(np.asarray(u), f * np.asarray(r), rtol=1e-6, err_msg=f"{form} {name}")
