"""depth_residual_scale: the absorbed form reproduces the explicit h + alpha f(h) network.

The proof is the equivalence test: a residual MLP trained 20 steps with the
explicit multiplier and the same network with absorbed init (branch last layer
times alpha, multiplier 1) + depth_residual_scale give the same outputs (f32,
rel. tol 1e-4), for every optimizer the package names, with weight decay too.
Negative controls show the test can fail: without the transform, with the
wrong power of alpha, or with the decay placed before the transform, the two
forms differ by far more than the tolerance.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax.nn import linen as snn

K = 8  # blocks; alpha = 2 / 8 = 0.25
WIDTH, D_IN, D_OUT, BATCH, STEPS = 16, 8, 4, 32, 20
ALPHA = 2 / K
WD = 0.05


# Decay matrices only (stacked biases are 2-D, so decide by geometry, not ndim).
_kernels_only = so.expert.label_by_geometry(lambda path, g: g.kind != "vector")


@functools.cache
def _problem():
    kx, ky, kt = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (BATCH, D_IN))
    y = jax.random.normal(ky, (BATCH, D_OUT))
    x_test = jax.random.normal(kt, (64, D_IN))
    return x, y, x_test


@functools.cache
def _forms():
    explicit = snn.ResidualMLP(WIDTH, K, D_OUT)  # h + alpha f(h)
    absorbed = snn.ResidualMLP(WIDTH, K, D_OUT, absorbed=True)  # h + f(h), dense_1 init * alpha
    x, _, _ = _problem()
    p_exp = jax.jit(explicit.init)(jax.random.key(0), x)["params"]
    p_abs = so.depth_scaled_init(p_exp, K)
    return explicit, p_exp, absorbed, p_abs


def _train_jit(model, tx, steps):
    """``steps`` full-batch steps of 0.5 * MSE; returns the test outputs."""
    x, y, x_test = _problem()

    def loss(p):
        return 0.5 * jnp.mean((model.apply({"params": p}, x) - y) ** 2)

    @jax.jit
    def run(params):
        def step(carry, _):
            p, s = carry
            g = jax.grad(loss)(p)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
        return model.apply({"params": params}, x_test)

    return run


def _train_pair(tx_exp, tx_abs):
    """Train the explicit and the absorbed form (one compile); test outputs of both.

    Traced at float32-accurate matmul precision: at a GPU's default (TF32) or
    a TPU's (one bfloat16 pass) the two forms' different rounding grows over
    20 steps to 5e-4..1e-2, far above the 1e-4 tolerance.
    """
    explicit, p_exp, absorbed, p_abs = _forms()
    run_e, run_a = _train_jit(explicit, tx_exp, STEPS), _train_jit(absorbed, tx_abs, STEPS)
    both = jax.jit(lambda pe, pa: (run_e(pe), run_a(pa)))
    with jax.default_matmul_precision("highest"):
        out_e, out_a = both(p_exp, p_abs)
    return np.asarray(out_e, np.float64), np.asarray(out_a, np.float64)


def _rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def _assert_same(a, b, tol=1e-4):
    err = _rel_err(a, b)
    assert err <= tol, f"explicit vs absorbed relative difference {err:.2e} > {tol}"
    np.testing.assert_allclose(b, a, rtol=tol, atol=tol * np.abs(a).max())


# --------------------------------------------------------------------------
# Optimizers under test: (name, explicit tx, absorbed tx) factories.
# Each absorbed chain is "<optimizer without decay> -> depth_residual_scale ->
# decay", the documented order.
# --------------------------------------------------------------------------
def _spectral_sgd(wd):
    lr = 0.05
    explicit = so.spectral_sgd(lr, weight_decay=wd, weight_decay_mask=_kernels_only)
    absorbed = optax.chain(
        so.spectral_sgd(lr, weight_decay=0.0),
        so.depth_residual_scale(K),
        so.decoupled_weight_decay(lr, wd, mask=_kernels_only),
    )
    return explicit, absorbed


def _spectral_sgd_parts(wd):
    """The same, assembled from parts with optax.add_decayed_weights."""
    lr = 0.05

    def chain(*middle):
        return optax.chain(
            optax.trace(0.9),
            so.scale_by_spectral_norm(),
            *middle,
            optax.add_decayed_weights(wd, _kernels_only),
            optax.scale_by_learning_rate(lr),
        )

    return chain(), chain(so.depth_residual_scale(K))


def _sgd(wd):
    """Plain SGD with momentum: the alpha**2 rule."""
    lr = optax.linear_schedule(0.05, 0.02, STEPS)  # a schedule, to check the count
    explicit = optax.chain(
        optax.trace(0.9), optax.add_decayed_weights(wd, _kernels_only),
        optax.scale_by_learning_rate(lr),
    )
    absorbed = optax.chain(
        optax.sgd(lr, momentum=0.9),
        so.depth_residual_scale(K, optimizer_kind="sgd"),
        so.decoupled_weight_decay(lr, wd, mask=_kernels_only),
    )
    return explicit, absorbed


def _moga(p):
    def make(wd):
        lr = 0.005
        explicit = so.moga(lr, p=p, weight_decay=wd, weight_decay_mask=_kernels_only)
        absorbed = optax.chain(
            so.moga(lr, p=p, weight_decay=0.0),
            so.depth_residual_scale(K),
            so.decoupled_weight_decay(lr, wd, mask=_kernels_only),
        )
        return explicit, absorbed

    return make


def _muon(wd):
    # float32 Newton-Schulz on every backend (GPUs/TPUs default to bfloat16,
    # whose round-off the 20 steps amplify past the tolerance).
    lr, f32 = 0.02, jnp.float32
    explicit = so.muon(lr, weight_decay=wd, weight_decay_mask=_kernels_only, compute_dtype=f32)
    absorbed = optax.chain(
        so.muon(lr, weight_decay=0.0, compute_dtype=f32),
        so.depth_residual_scale(K),
        so.decoupled_weight_decay(lr, wd, mask=_kernels_only),
    )
    return explicit, absorbed


def _optax_muon(wd):
    """optax.contrib.muon (the anchor users compare with).

    Without muon_weight_dimension_numbers it orthogonalizes 2-D leaves only;
    the stacked (K, d, d) kernels and the vectors get its Adam, which is scale
    invariant up to adam eps (1e-8, tiny next to these gradients); NS
    normalizes by ||G||_F + eps with eps set to 1e-12. Its decay covers the
    Muon leaves only, so this check runs without decay.
    """
    lr = 0.02
    explicit = optax.contrib.muon(lr, weight_decay=wd, weight_decay_mask=_kernels_only,
                                  adam_eps_root=0.0, eps=1e-12)
    absorbed = optax.chain(
        optax.contrib.muon(lr, weight_decay=0.0, adam_eps_root=0.0, eps=1e-12),
        so.depth_residual_scale(K),
        so.decoupled_weight_decay(lr, wd, mask=_kernels_only),
    )
    return explicit, absorbed


slow = pytest.mark.slow
CASES = [
    pytest.param(_spectral_sgd, WD, id="spectral_sgd-wd"),
    pytest.param(_spectral_sgd, 0.0, id="spectral_sgd-no_wd", marks=slow),
    pytest.param(_spectral_sgd_parts, WD, id="spectral_sgd_parts-wd", marks=slow),
    pytest.param(_sgd, WD, id="sgd_alpha2-wd"),
    pytest.param(_sgd, 0.0, id="sgd_alpha2-no_wd", marks=slow),
]
if hasattr(so, "muon"):
    CASES += [pytest.param(_muon, WD, id="muon-wd"),
              pytest.param(_muon, 0.0, id="muon-no_wd", marks=slow)]
if hasattr(so, "moga"):
    CASES += [pytest.param(_moga(2.0), WD, id="moga_p2-wd"),
              pytest.param(_moga(1.5), WD, id="moga_p1.5-wd", marks=slow),
              pytest.param(_moga(2.5), WD, id="moga_p2.5-wd", marks=slow),
              pytest.param(_moga(2.0), 0.0, id="moga_p2-no_wd", marks=slow)]


@pytest.mark.parametrize("make,wd", CASES)
def test_absorbed_form_matches_explicit(make, wd):
    explicit, p_exp, _, _ = _forms()
    out_exp, out_abs = _train_pair(*make(wd))
    # The runs really trained (20 steps moved the outputs).
    out_init = np.asarray(explicit.apply({"params": p_exp}, _problem()[2]))
    assert _rel_err(out_init, out_exp) > 1e-2
    _assert_same(out_exp, out_abs)


@pytest.mark.slow
def test_optax_contrib_muon_matches_to_its_epsilons():
    _assert_same(*_train_pair(*_optax_muon(0.0)))


# --------------------------------------------------------------------------
# Negative controls: the equivalence test can fail.
# --------------------------------------------------------------------------
def test_without_transform_the_forms_differ():
    out_exp, out_abs = _train_pair(so.spectral_sgd(0.05), so.spectral_sgd(0.05))
    assert _rel_err(out_exp, out_abs) > 1e-2


def test_sgd_needs_alpha_squared_not_alpha():
    wrong = optax.chain(optax.sgd(0.05), so.depth_residual_scale(K))  # alpha, not alpha^2
    out_exp, out_abs = _train_pair(optax.sgd(0.05), wrong)
    assert _rel_err(out_exp, out_abs) > 1e-2


def test_decay_before_the_transform_is_wrong():
    """Scaling after the decay multiplies the decay by alpha: not the explicit dynamics."""
    lr, wd = 0.05, 0.5
    tx_exp = so.spectral_sgd(lr, weight_decay=wd, weight_decay_mask=_kernels_only)
    tx_wrong = optax.chain(
        so.spectral_sgd(lr, weight_decay=wd, weight_decay_mask=_kernels_only),
        so.depth_residual_scale(K),
    )
    out_exp, out_abs = _train_pair(tx_exp, tx_wrong)
    assert _rel_err(out_exp, out_abs) > 1e-3


# --------------------------------------------------------------------------
# Unit checks against hand-computed numbers.
# --------------------------------------------------------------------------
def test_residual_alpha_and_errors():
    assert so.residual_alpha(64) == 2 / 64
    assert so.residual_alpha(8, base_blocks=4) == 0.5
    with pytest.raises(ValueError):
        so.residual_alpha(0)
    with pytest.raises(ValueError, match="optimizer_kind"):
        so.depth_residual_scale(4, optimizer_kind="adam")


def _toy_params():
    return {
        "input_proj": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))},
        "blocks": {
            "dense_0": {"kernel": jnp.ones((5, 4, 4)), "bias": jnp.ones((5, 4))},
            "dense_1": {"kernel": jnp.ones((5, 4, 4)), "bias": jnp.ones((5, 4))},
        },
        "head": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones((2,))},
    }


@pytest.mark.parametrize("kind,factor", [("scale_invariant", 2 / 5), ("sgd", (2 / 5) ** 2)])
def test_update_factors_exact(kind, factor):
    params = _toy_params()
    tx = so.depth_residual_scale(5, optimizer_kind=kind)
    grads = jax.tree_util.tree_map(lambda x: 3.0 * x, params)
    out, _ = tx.update(grads, tx.init(params), params)
    for path, u in jax.tree_util.tree_flatten_with_path(out)[0]:
        name = "/".join(k.key for k in path)
        expected = 3.0 * factor if name.startswith("blocks/dense_1") else 3.0
        np.testing.assert_array_equal(np.asarray(u), np.full(u.shape, expected, np.float32))


def test_masks_regex_callable_tree_and_geometry():
    params = _toy_params()
    sel = lambda tx: {
        "/".join(k.key for k in path)
        for path, u in jax.tree_util.tree_flatten_with_path(tx.update(params, tx.init(params))[0])[0]
        if float(u.reshape(-1)[0]) != 1.0
    }
    assert sel(so.depth_residual_scale(4)) == {"blocks/dense_1/kernel", "blocks/dense_1/bias"}
    assert sel(so.depth_residual_scale(4, mask=r"head/kernel$")) == {"head/kernel"}
    assert sel(so.depth_residual_scale(4, mask=[r"^head/", r"input_proj/bias"])) == {
        "head/kernel", "head/bias", "input_proj/bias"}
    # (path, geometry) callable: every stacked matrix (batch axis 0).
    by_geom = so.depth_residual_scale(
        4, mask=lambda path, g: g.kind == "matrix" and g.batch_axes == (0,))
    assert sel(by_geom) == {"blocks/dense_0/kernel", "blocks/dense_1/kernel"}
    # optax-style callable and explicit tree.
    tree = jax.tree_util.tree_map(lambda x: False, params)
    tree["head"]["bias"] = True
    assert sel(so.depth_residual_scale(4, mask=lambda p: tree)) == {"head/bias"}
    assert sel(so.depth_residual_scale(4, mask=tree)) == {"head/bias"}


def test_mask_selecting_nothing_names_paths():
    params = {"encoder": {"kernel": jnp.ones((3, 3))}}
    with pytest.raises(so.GeometryError, match=re.escape("encoder/kernel")):
        so.depth_residual_scale(4).init(params)
    with pytest.raises(so.GeometryError, match="mask selects no parameter"):
        so.depth_scaled_init(params, 4)


def test_dtype_preserved_and_zero_grads_finite():
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), _toy_params())
    tx = optax.chain(so.depth_residual_scale(64), so.decoupled_weight_decay(0.1, 0.01))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    out, _ = tx.update(zeros, tx.init(params), params)
    for u in jax.tree_util.tree_leaves(out):
        assert u.dtype == jnp.bfloat16
        assert bool(jnp.all(jnp.isfinite(u)))
    k = out["blocks"]["dense_1"]["kernel"]
    np.testing.assert_allclose(np.asarray(k, np.float32), -0.1 * 0.01, rtol=1e-2)


def test_scale_init_and_depth_scaled_init_agree_with_model_init(highest_precision):
    explicit, p_exp, absorbed, p_abs = _forms()
    x, _, _ = _problem()
    p_model = absorbed.init(jax.random.key(0), x)["params"]
    for a, b in zip(jax.tree_util.tree_leaves(p_abs), jax.tree_util.tree_leaves(p_model)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    k_exp = np.asarray(p_exp["blocks"]["dense_1"]["kernel"], np.float64)
    np.testing.assert_allclose(np.asarray(p_abs["blocks"]["dense_1"]["kernel"]), ALPHA * k_exp,
                               rtol=1e-6)
    # The two forms compute the same function at init.
    np.testing.assert_allclose(absorbed.apply({"params": p_abs}, x),
                               explicit.apply({"params": p_exp}, x), rtol=1e-5, atol=1e-6)


def test_inject_hyperparams_and_schedule():
    """Injected schedule + depth scaling: each step's update is the un-injected chain's, whose
    branch-out leaves are alpha = 2/4 times spectral_sgd's at the schedule's learning rate."""
    params = _toy_params()
    sched = optax.linear_schedule(0.1, 0.02, 4)
    make = lambda learning_rate: optax.chain(
        so.spectral_sgd(learning_rate, momentum=0.5), so.depth_residual_scale(4))
    tx = optax.inject_hyperparams(make)(learning_rate=sched)
    plain = so.spectral_sgd(0.1, momentum=0.5)  # unit check against a constant-LR run, rescaled
    s, sp = tx.init(params), plain.init(params)
    step = jax.jit(tx.update)
    branch = re.compile(so.expert.BRANCH_OUT_PATTERN)
    for t in range(3):
        g = jax.tree.map(lambda x, t=t: x * (1.0 + t) + jnp.arange(x.size).reshape(x.shape) % 3, params)
        u, s = step(g, s, params)
        up, sp = plain.update(g, sp, params)
        assert float(s.hyperparams["learning_rate"]) == pytest.approx(float(sched(t)), rel=1e-6)
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(u)[0], jax.tree_util.tree_leaves(up)):
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            factor = (0.5 if branch.search(name) else 1.0) * float(sched(t)) / 0.1
            np.testing.assert_allclose(np.asarray(a), factor * np.asarray(b), rtol=1e-5, err_msg=name)


@pytest.mark.usefixtures("highest_precision")
def test_residual_alpha_accepts_a_single_block():
    """One residual block is a valid depth: alpha = K_base / 1."""
    assert so.residual_alpha(1) == 2.0
    assert so.residual_alpha(1, 4, exponent=0.5) == 2.0
    with pytest.raises(ValueError, match="num_blocks must be a positive integer"):
        so.residual_alpha(0)


@pytest.mark.usefixtures("highest_precision")
def test_depth_mask_of_wrong_structure_names_the_fix():
    """A mask tree that is not shaped like the params: the error names the transform and the regex fix."""
    params = {"blocks": {"dense_1": {"kernel": jnp.ones((2, 2))}}, "head": {"kernel": jnp.ones((2, 2))}}
    tx = so.depth_residual_scale(4, mask={"blocks": True})
    with pytest.raises(so.GeometryError, match=r"depth_residual_scale: the mask tree does not have the structure"):
        tx.init(params)


@pytest.mark.usefixtures("highest_precision")
def test_scale_init_forwards_extra_positional_arguments():
    """scale_init passes the initializer's extra positional arguments through."""

    def init(key, shape, dtype, fill):
        return jnp.full(shape, fill, dtype)

    out = so.expert.scale_init(init, 0.5)(jax.random.key(0), (2, 3), jnp.float32, 3.0)
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 3), 1.5, np.float32))
