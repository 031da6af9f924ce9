"""Optax conventions, for every public transform and named optimizer.

* ``update(updates, state, params, **extra_args)``: extra keyword arguments
  are accepted and ignored (``GradientTransformationExtraArgs``);
* ``optax.tree_map_params`` maps the parameter-shaped leaves of every state;
* ``optax.inject_hyperparams`` works on Flax-named trees and on plain
  pytrees (whose undecidable leaves take the element-wise route), and every
  numeric hyperparameter injected gives the update of the optimizer built
  with that value (and a different update than the default value);
* every learning rate accepts a schedule; ``optax.MultiSteps`` accumulates;
* params dtype preserved (float32, bfloat16); state structure, shapes and
  dtypes stable across steps and through ``lax.cond``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

# float64 / cross-path comparisons: true float32 matmuls on every backend (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("highest_precision")


def flax_tree(dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {
        "Embed_0": {"embedding": (9, 4)},
        "Dense_0": {"kernel": (4, 6), "bias": (6,)},
        "Dense_1": {"kernel": (6, 5)},
        "LayerNorm_0": {"scale": (5,)},
        "head": {"kernel": (5, 3), "bias": (3,)},
    }
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s), dtype), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def plain_tree(dtype=jnp.float32, seed=0):
    """A non-Flax pytree: a 3-D leaf no rule decides, a list, a 0-d leaf."""
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.standard_normal((2, 5, 3)), dtype),
            "layers": [jnp.asarray(rng.standard_normal((3, 4)), dtype), jnp.asarray(rng.standard_normal((4,)), dtype)],
            "t": jnp.asarray(0.5, dtype)}


def grads_like(tree, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape) * 10.0 ** rng.uniform(-1, 1), x.dtype),
                        tree)


# name -> (constructor, kwargs): every named optimizer, with options that reach every route.
OPTIMIZERS = {
    "muon": (so.muon, {"learning_rate": 0.02}),
    "contrib_muon": (so.contrib_muon, {"learning_rate": 0.02}),
    "normuon": (so.normuon, {"learning_rate": 0.02, "weight_decay": 0.01}),
    "moga": (so.moga, {"learning_rate": 0.01, "rules": {r"Dense_1/kernel$": "adam"}}),
    "spectral_sgd": (so.spectral_sgd, {"learning_rate": 0.05}),
    "spectral_sgd_power": (so.spectral_sgd, {"learning_rate": 0.05, "method": "power"}),
    "mup_sgd": (so.mup_sgd, {"learning_rate": 0.05, "momentum": 0.9}),
    "mup_adamw": (so.mup_adamw, {"learning_rate": 0.01}),
    "rescaled_adamw": (so.rescaled_adamw, {"learning_rate": 0.01}),
}

TRANSFORMS = {
    "scale_by_row_norm": lambda: so.scale_by_row_norm(1.5),
    "scale_by_column_norm": lambda: so.scale_by_column_norm(3.0),
    "scale_by_sign": so.scale_by_sign,
    "orthogonalize_via_newton_schulz": so.orthogonalize_via_newton_schulz,
    "scale_by_neuron_second_moment": so.scale_by_neuron_second_moment,
    "scale_by_spectral_norm": lambda: so.scale_by_spectral_norm(method="power"),
    "scale_by_fan_out_rms": so.scale_by_fan_out_rms,
    "scale_by_parametrization1": lambda: so.scale_by_parametrization1("adam"),
    "ema_momentum": lambda: so.ema_momentum(0.9, nesterov=True, bias_correction=True),
    "decoupled_weight_decay": lambda: so.decoupled_weight_decay(0.1, 0.01),
    "depth_residual_scale": lambda: so.depth_residual_scale(4, mask=r"Dense_1/kernel$"),
    "route_lr_scale": lambda: so.route_lr_scale(embedding=4.0, output=0.5),
}

ALL = {**{k: (lambda c=c, kw=kw: c(**kw)) for k, (c, kw) in OPTIMIZERS.items()}, **TRANSFORMS}


def steps(tx, params, n=3, seed=10, **extra):
    state = tx.init(params)
    for i in range(n):
        u, state = tx.update(grads_like(params, seed + i), state, params, **extra)
        params = optax.apply_updates(params, u)
    return params, state


def assert_trees_close(a, b, rtol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                                         rtol=rtol, atol=1e-7), a, b)


@pytest.fixture(autouse=True)
def _no_geometry_warning_noise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", so.GeometryWarning)
        yield


# ------------------------------------------------------------------ extra args, tree_map_params
@pytest.mark.parametrize("name", sorted(ALL))
def test_extra_args_accepted_and_ignored(name):
    params = flax_tree()
    tx = ALL[name]()
    g = grads_like(params, 1)
    state = tx.init(params)
    u1, s1 = tx.update(g, state, params)
    u2, s2 = tx.update(g, state, params, value=jnp.asarray(3.0), grad=g, anything="ignored")
    assert_trees_close(u1, u2, rtol=0)
    assert_trees_close(s1, s2, rtol=0)


@pytest.mark.parametrize("name", sorted(ALL))
def test_tree_map_params_maps_every_param_shaped_leaf(name):
    params = flax_tree()
    tx = ALL[name]()
    _, state = steps(tx, params, n=1)
    mapped = optax.tree_map_params(tx, lambda p: jnp.full(p.shape, 7.0, p.dtype), state)
    assert jax.tree.structure(mapped) == jax.tree.structure(state)
    n_params = len(jax.tree.leaves(params))
    sevens = [x for x in jax.tree.leaves(mapped) if x.size and np.all(np.asarray(x) == 7.0)]
    param_like = optax.tree_map_params(tx, lambda p: True, state, transform_non_params=lambda _: False)
    n_mapped = sum(bool(x) for x in jax.tree.leaves(param_like))
    # Every state leaf shaped like a param is mapped; states with moments have >= one per param.
    assert len(sevens) == n_mapped
    stateful = not name.startswith(("scale_by_row", "scale_by_col", "scale_by_sign", "orthogonalize",
                                    "scale_by_fan", "scale_by_param", "decoupled", "scale_by_spectral",
                                    "depth", "route"))
    assert (n_mapped >= n_params) if stateful else (n_mapped == 0)


# ------------------------------------------------------------------ inject_hyperparams
# Per optimizer: {hyperparameter: another value}; each must change the update.
INJECTED = {
    "muon": {"learning_rate": 0.05, "momentum": 0.5, "weight_decay": 0.3, "adam_b1": 0.5, "adam_b2": 0.9,
             "adam_eps": 0.5, "adam_weight_decay": 0.3},
    "normuon": {"learning_rate": 0.05, "momentum": 0.5, "beta2": 0.5, "weight_decay": 0.3, "adam_b2": 0.9},
    "moga": {"learning_rate": 0.03, "base_factor": 5.0, "momentum": 0.5, "weight_decay": 0.3, "adam_b2": 0.9,
             "adam_eps": 0.5, "p": 3.0},
    "spectral_sgd": {"learning_rate": 0.1, "momentum": 0.3, "weight_decay": 0.3},
    "mup_sgd": {"learning_rate": 0.1, "momentum": 0.3, "weight_decay": 0.3},
    "mup_adamw": {"learning_rate": 0.03, "b1": 0.5, "b2": 0.9, "eps": 0.5, "weight_decay": 0.3},
    "rescaled_adamw": {"learning_rate": 0.03, "p": 2.0, "q": 2.0, "b1": 0.5, "b2": 0.9, "eps": 0.5,
                       "weight_decay": 0.3},
}


def _with_value(name, hp, value):
    ctor, kw = OPTIMIZERS[name]
    return ctor, {**kw, hp: value}


@pytest.mark.slow
@pytest.mark.parametrize("tree", [flax_tree, plain_tree])
@pytest.mark.parametrize("name", sorted(INJECTED))
def test_every_injected_hyperparameter_changes_the_update_as_built(name, tree):
    params = tree()
    if tree is plain_tree and name == "moga":
        extra_kw = {"rules": {r"^t$": "adam"}}
    else:
        extra_kw = {}
    ctor, base_kw = OPTIMIZERS[name]
    base_kw = {**base_kw, **extra_kw}
    ref_default, _ = steps(ctor(**base_kw), params, n=2)
    for hp, value in INJECTED[name].items():
        kw = {**base_kw, hp: value}
        injected = optax.inject_hyperparams(ctor)(**base_kw)
        state = injected.init(params)
        state.hyperparams[hp] = jnp.asarray(value, state.hyperparams[hp].dtype)
        p = params
        for i in range(2):
            u, state = injected.update(grads_like(params, 10 + i), state, p)
            p = optax.apply_updates(p, u)
        built, _ = steps(ctor(**kw), params, n=2)
        assert_trees_close(p, built, rtol=1e-4)
        differs = any(not np.allclose(a, b, rtol=1e-6, atol=0) for a, b in
                      zip(jax.tree.leaves(built), jax.tree.leaves(ref_default)))
        assert differs, f"{name}: {hp}={value} did not change the update"


# ------------------------------------------------------------------ schedules, MultiSteps
LR_NAMES = {
    "muon": ("learning_rate", "adam_learning_rate"),
    "contrib_muon": ("learning_rate", "adam_learning_rate"),
    "normuon": ("learning_rate", "adam_learning_rate"),
    "moga": ("learning_rate",),
    "spectral_sgd": ("learning_rate",),
    "mup_sgd": ("learning_rate",),
    "mup_adamw": ("learning_rate",),
    "rescaled_adamw": ("learning_rate",),
}


@pytest.mark.parametrize("name", sorted(LR_NAMES))
def test_every_learning_rate_accepts_a_schedule(name):
    params = flax_tree()
    ctor, kw = OPTIMIZERS[name]
    lrs = [0.03, 0.01, 0.02]
    kws = {k: optax.piecewise_constant_schedule(lrs[0], {1: lrs[1] / lrs[0], 2: lrs[2] / lrs[1]})
           for k in LR_NAMES[name]}
    tx = ctor(**{**kw, **kws})
    state = tx.init(params)
    constant = [ctor(**{**kw, **{k: lr for k in LR_NAMES[name]}}) for lr in lrs]
    c_states = [c.init(params) for c in constant]
    for i in range(3):
        g = grads_like(params, 20 + i)
        u, state = tx.update(g, state, params)
        for j, c in enumerate(constant):
            uc, c_states[j] = c.update(g, c_states[j], params)
            if j == i:
                assert_trees_close(u, uc, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["muon", "moga", "mup_adamw", "spectral_sgd"])
def test_multisteps_accumulates_the_mean_gradient(name):
    params = flax_tree()
    ctor, kw = OPTIMIZERS[name]
    k = 3
    multi = optax.MultiSteps(ctor(**kw), every_k_schedule=k)
    state = multi.init(params)
    gs = [grads_like(params, 30 + i) for i in range(k)]
    for i, g in enumerate(gs):
        u, state = multi.update(g, state, params)
        if i < k - 1:
            assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(u))
    plain = ctor(**kw)
    mean = jax.tree.map(lambda *xs: sum(xs) / k, *gs)
    want, _ = plain.update(mean, plain.init(params), params)
    assert_trees_close(u, want, rtol=1e-5)


# ------------------------------------------------------------------ dtypes and state stability
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_params_dtype_and_state_stable_across_steps_and_cond(name, dtype):
    params = flax_tree(dtype)
    ctor, kw = OPTIMIZERS[name]
    tx = ctor(**kw)
    state0 = tx.init(params)
    spec = lambda t: jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), t)
    p, state = params, state0
    for i in range(2):
        u, state = tx.update(grads_like(params, 40 + i), state, p)
        p = optax.apply_updates(p, u)
        assert spec(p) == spec(params)
        assert spec(u) == spec(params)
        assert spec(state) == spec(state0)

    @jax.jit
    def maybe_step(pred, g, s, p):
        return jax.lax.cond(pred, lambda: tx.update(g, s, p), lambda: (jax.tree.map(jnp.zeros_like, g), s))

    u, _ = maybe_step(True, grads_like(params, 50), state, p)
    u_eager, _ = tx.update(grads_like(params, 50), state, p)
    assert_trees_close(u, u_eager, rtol=1e-2 if dtype == jnp.bfloat16 else 1e-5)
    _, s_skip = maybe_step(False, grads_like(params, 50), state, p)
    assert_trees_close(s_skip, state, rtol=0)


# ------------------------------------------------------------------ one state structure, injected or not
def _numeric_hyperparameters(ctor, kw):
    import inspect

    out = []
    for hp, prm in inspect.signature(ctor).parameters.items():
        value = kw.get(hp, prm.default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(hp)
    return out


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_structure_and_checkpoints_do_not_depend_on_injection(name):
    """``inject_hyperparams(opt)(...).init(p).inner_state`` has the structure of ``opt(...).init(p)``, for
    every numeric hyperparameter injected alone (the others static) and all of them together; a state saved
    from one restores into the other and both continue with the same updates."""
    from flax import serialization

    ctor, kw = OPTIMIZERS[name]
    params = flax_tree()
    plain = ctor(**kw)
    plain_state = plain.init(params)
    hps = _numeric_hyperparameters(ctor, kw)
    assert "learning_rate" in hps and len(hps) >= 2, hps
    variants = [[hp] for hp in hps] + [hps]
    for injected_hps in variants:
        static = {h for h in hps if h not in injected_hps} | {k for k in kw if k not in hps}
        injected = optax.inject_hyperparams(ctor, static_args=tuple(static))(**kw)
        inj_state = injected.init(params)
        assert jax.tree.structure(inj_state.inner_state) == jax.tree.structure(plain_state), (name, injected_hps)

    # Save from plain after two steps, restore into the injected (all hyperparameters injected) and back.
    injected = optax.inject_hyperparams(ctor)(**kw)
    p, state = params, plain_state
    for i in range(2):
        u, state = plain.update(grads_like(params, 20 + i), state, p)
        p = optax.apply_updates(p, u)
    blob = serialization.to_bytes(state)
    template = injected.init(params)
    restored = template._replace(inner_state=serialization.from_bytes(template.inner_state, blob))
    back = serialization.from_bytes(plain.init(params), serialization.to_bytes(restored.inner_state))
    pa, sa, pb, sb, pc, sc = p, state, p, restored, p, back
    for i in range(2, 4):
        g = grads_like(params, 20 + i)
        ua, sa = plain.update(g, sa, pa)
        ub, sb = injected.update(g, sb, pb)
        uc, sc = plain.update(g, sc, pc)
        pa, pb, pc = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub), optax.apply_updates(pc, uc)
    for a, b, c in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), jax.tree.leaves(pc)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(c), np.asarray(a))
