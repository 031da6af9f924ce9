"""The bad-value contract of every named optimizer (docs/reliability.md).

* A NaN / inf gradient entry propagates as in optax: the affected leaf's
  update is non-finite (never silently made finite), the other leaves'
  updates are exactly those of a clean tree; under ``optax.apply_if_finite``
  such a step is skipped with params and inner state unchanged, and the run
  continues as if the step had not happened.
* Integer and boolean leaves and size-0 leaves are left unchanged (an update
  of exactly zero in their own dtype); 0-d float leaves are trained; a leaf
  that is not an array is rejected with a ``TypeError`` naming its path.
* Invalid options are rejected at construction, naming the option and the fix.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

# float64 / cross-path comparisons: true float32 matmuls on every backend (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("highest_precision")

OPTIMIZERS = {
    "muon": lambda: so.muon(0.02, weight_decay=0.1),
    "contrib_muon": lambda: so.contrib_muon(0.02),
    "moga": lambda: so.moga(0.01, p=1.5),
    "spectral_sgd": lambda: so.spectral_sgd(0.05, method="power"),
    "mup_sgd": lambda: so.mup_sgd(0.05, momentum=0.9),
    "mup_adamw": lambda: so.mup_adamw(0.01),
    "rescaled_adamw": lambda: so.rescaled_adamw(0.01),
}


def tree(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"Embed_0": {"embedding": (7, 4)}, "Dense_0": {"kernel": (4, 6), "bias": (6,)},
              "Dense_1": {"kernel": (6, 6)}, "head": {"kernel": (6, 3)}}
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s), jnp.float32), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def with_bad(g, value, path=("Dense_1", "kernel"), index=(2, 3)):
    g = jax.tree.map(lambda x: x, g)
    g[path[0]][path[1]] = g[path[0]][path[1]].at[index].set(value)
    return g


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_non_finite_gradient_propagates_to_its_leaf_only(name, bad):
    tx = OPTIMIZERS[name]()
    params = tree()
    g = tree(1)
    state = tx.init(params)
    clean, _ = tx.update(g, state, params)
    dirty, _ = tx.update(with_bad(g, bad), state, params)
    assert not np.all(np.isfinite(dirty["Dense_1"]["kernel"]))
    for path in (("Dense_0", "kernel"), ("Dense_0", "bias"), ("Embed_0", "embedding"), ("head", "kernel")):
        np.testing.assert_array_equal(dirty[path[0]][path[1]], clean[path[0]][path[1]], err_msg=str(path))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_apply_if_finite_skips_the_step_with_params_and_state_unchanged(name):
    params = tree()
    gs = [tree(10 + i) for i in range(3)]
    guarded = optax.apply_if_finite(OPTIMIZERS[name](), max_consecutive_errors=5)
    plain = OPTIMIZERS[name]()
    p, s = params, guarded.init(params)
    q, t = params, plain.init(params)
    for i, g in enumerate(gs):
        if i == 1:  # a bad step between the good ones
            before = (p, s.inner_state)
            u, s = guarded.update(with_bad(g, np.nan), s, p)
            p = optax.apply_updates(p, u)
            jax.tree.map(np.testing.assert_array_equal, (p, s.inner_state), before)
            assert int(s.notfinite_count) == 1 and not bool(s.last_finite)
        u, s = guarded.update(g, s, p)
        p = optax.apply_updates(p, u)
        v, t = plain.update(g, t, q)
        q = optax.apply_updates(q, v)
    # The skipped step left no trace (up to float32 rounding: apply_if_finite runs the
    # inner update under lax.cond, compiled differently from the plain eager update).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p, q)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_integer_boolean_size0_leaves_unchanged_and_0d_trained(name):
    params = {**tree(), "counter": jnp.arange(4, dtype=jnp.int32), "mask": jnp.array([True, False]),
              "empty": jnp.zeros((0, 4)), "temperature": jnp.asarray(2.0)}
    tx = OPTIMIZERS[name]()
    grads = jax.tree.map(lambda x: jnp.ones(x.shape, x.dtype), params)
    state = tx.init(params)
    for _ in range(2):
        u, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, u)
    for k in ("counter", "mask", "empty"):
        assert u[k].dtype == params[k].dtype and u[k].shape == params[k].shape
        np.testing.assert_array_equal(u[k], np.zeros(params[k].shape, params[k].dtype))
        np.testing.assert_array_equal(new[k], params[k])
        assert new[k].dtype == params[k].dtype
    assert np.isfinite(float(new["temperature"])) and float(new["temperature"]) != 2.0
    # The float leaves get the same update as without the extra leaves.
    plain_tx = OPTIMIZERS[name]()
    ref, _ = plain_tx.update(jax.tree.map(jnp.ones_like, tree()), plain_tx.init(tree()), tree())
    first, _ = tx.update(grads, tx.init(params), params)
    for k in ref:  # (equal up to float32 rounding: the trees are compiled differently)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), first[k], ref[k])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_non_array_leaf_rejected_with_its_path(name):
    params = {**tree(), "block": {"gain": 1.5}}
    with pytest.raises(TypeError, match=r"'block/gain' is a float, not an array.*jnp.asarray"):
        OPTIMIZERS[name]().init(params)


def test_finite_extremes_give_finite_updates():
    params = tree()
    for scale in (1e-30, 1e30):
        g = jax.tree.map(lambda x, scale=scale: x * scale, tree(3))
        for name, make in OPTIMIZERS.items():
            tx = make()
            u, _ = tx.update(g, tx.init(params), params)
            assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(u)), (name, scale)


# ------------------------------------------------------------------ invalid options
@pytest.mark.parametrize(("make", "match"), [
    (lambda: so.moga(0.1, p=0.5), r"p must be"),
    (lambda: so.moga(0.1, variant="diag"), r"variant must be 'row' or 'col'"),
    (lambda: so.moga(0.1, q=0.0), r"q must be"),
    (lambda: so.moga(0.1, q=-1.0), r"q must be"),
    (lambda: so.moga(0.1, rules={r"Dense_0": "rowz"}), r"rules\['Dense_0'\] = 'rowz'"),
    (lambda: so.moga(0.1, rules={r"Dense_(": "row"}), r"Dense_\("),
    (lambda: so.rescaled_adamw(0.1, p=0.9), r"p must be"),
    (lambda: so.rescaled_adamw(0.1, q=0.0), r"q must be in \(0, inf\]"),
    (lambda: so.scale_by_row_norm(0.0), r"p must be"),
    (lambda: so.scale_by_column_norm(1.0), r"q must be in"),
    (lambda: so.muon(0.1, embedding="sgd"), r"embedding= must be one of"),
    (lambda: so.muon(0.1, elementwise="sign"), r"elementwise= must be one of"),
    (lambda: so.muon(0.1, scale="frobenius"), r"scale must be one of"),
    (lambda: so.muon(0.1, ns_method="fast"), r"ns_method must be one of"),
    (lambda: so.muon(0.1, ns_steps=0), r"steps must be >= 1"),
    (lambda: so.muon(0.1, ns_coefficients="cubic"), r"cubic"),
    (lambda: so.spectral_sgd(0.1, method="svd"), r"method must be one of"),
    (lambda: so.spectral_sgd(0.1, method="power", power_iterations=0), r"power_iterations must be >= 1"),
    (lambda: so.mup_sgd(0.1, geometry={r"Dense_(": "matrix"}), r"Dense_\("),
    (lambda: so.scale_by_parametrization1("lion"), r"kind must be one of"),
])
def test_invalid_options_rejected_at_construction(make, match):
    with pytest.raises((ValueError, TypeError)) as e:
        make()
    assert re.search(match, str(e.value)), str(e.value)


def test_rule_matching_no_parameter_rejected_with_the_paths():
    tx = so.moga(0.1, rules={r"Dense_7/kernel$": "adam"})
    with pytest.raises(ValueError, match=r"(?s)rules\['Dense_7/kernel\$'\] matches no parameter.*Dense_0/kernel"):
        tx.init(tree())


def test_geometry_override_errors_name_the_path_and_never_fall_back():
    params = tree()
    bad = {r"Dense_1/kernel$": {"kind": "matrix", "fan_in_axes": (0,), "fan_out_axes": (0,)}}
    tx = so.muon(0.1, geometry=bad)
    with pytest.raises(so.GeometryError, match="Dense_1/kernel"):
        tx.init(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Flax-named tree: no fallback, no warning
        so.moga(0.1).init(params)


# ------------------------------------------------------------------ overrides that match nothing
UNMATCHED_OVERRIDE = {r"Dense_7/kernel$": "matrix"}
BY_OPTIMIZER_WITH_GEOMETRY = {
    "muon": lambda geometry: so.muon(0.02, geometry=geometry),
    "moga": lambda geometry: so.moga(0.01, geometry=geometry),
    "spectral_sgd": lambda geometry: so.spectral_sgd(0.05, geometry=geometry),
    "mup_sgd": lambda geometry: so.mup_sgd(0.05, geometry=geometry),
    "mup_adamw": lambda geometry: so.mup_adamw(0.01, geometry=geometry),
    "rescaled_adamw": lambda geometry: so.rescaled_adamw(0.01, geometry=geometry),
}


@pytest.mark.parametrize("name", sorted(BY_OPTIMIZER_WITH_GEOMETRY))
@pytest.mark.parametrize("as_map", [False, True])
def test_geometry_override_matching_nothing_rejected_at_init_with_the_paths(name, as_map):
    geometry = so.GeometryMap(UNMATCHED_OVERRIDE) if as_map else UNMATCHED_OVERRIDE
    tx = BY_OPTIMIZER_WITH_GEOMETRY[name](geometry)  # construction cannot know the params
    with pytest.raises(so.GeometryError, match=r"(?s)override 'Dense_7/kernel\$' matches no parameter"
                                               r".*Dense_0/kernel.*head/kernel.*Fix the regex") as e:
        tx.init(tree())
    assert isinstance(e.value, ValueError)
    # A matching override is accepted, and inside inject_hyperparams too.
    ok = BY_OPTIMIZER_WITH_GEOMETRY[name]({r"Dense_1/kernel$": "matrix"})
    u, _ = ok.update(tree(1), ok.init(tree()), tree())
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(u))
    injected = optax.inject_hyperparams(BY_OPTIMIZER_WITH_GEOMETRY[name])(geometry=geometry)
    with pytest.raises(so.GeometryError, match="Dense_7"):
        injected.init(tree())


# ------------------------------------------------------------------ size-0 leaves in the transforms
TRANSFORMS = {
    "scale_by_row_norm": lambda: so.scale_by_row_norm(1.5),
    "scale_by_row_norm(fan_scaling=False)": lambda: so.scale_by_row_norm(3.0, fan_scaling=False),
    "scale_by_column_norm": lambda: so.scale_by_column_norm(3.0),
    "scale_by_sign": lambda: so.scale_by_sign(),
    "scale_by_fan_out_rms": lambda: so.scale_by_fan_out_rms(),
    "scale_by_spectral_norm": lambda: so.scale_by_spectral_norm(),
    "scale_by_spectral_norm(power)": lambda: so.scale_by_spectral_norm(method="power"),
    "scale_by_parametrization1(sgd)": lambda: so.scale_by_parametrization1("sgd"),
    "scale_by_parametrization1(adam, base)": lambda: so.scale_by_parametrization1("adam", base=tree()),
    "scale_by_spectral_trust_ratio": lambda: so.scale_by_spectral_trust_ratio(),
    "orthogonalize_via_newton_schulz": lambda: so.orthogonalize_via_newton_schulz(),
    "ema_momentum": lambda: so.ema_momentum(0.9),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_leaves_size0_leaves_unchanged(name):
    """Every public transform passes size-0 leaves through (no error, no NaN) and
    gives the other leaves the update they get without the empty ones."""
    empties = {"Dense_7": {"kernel": jnp.zeros((0, 5)), "bias": jnp.zeros((0,))}, "Dense_8": {"kernel": jnp.zeros((3, 0))}}
    params = {**tree(), **empties}
    grads = {**tree(1), **empties}
    tx = TRANSFORMS[name]()
    state = tx.init(params)
    for _ in range(2):
        u, state = jax.jit(tx.update)(grads, state, params)
    for k, sub in empties.items():
        for leaf, x in sub.items():
            assert u[k][leaf].shape == x.shape and u[k][leaf].dtype == x.dtype
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(u))
    plain = TRANSFORMS[name]()
    s = plain.init(tree())
    for _ in range(2):
        ref, s = jax.jit(plain.update)(tree(1), s, tree())
    for k in ref:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), u[k], ref[k])


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


@pytest.mark.usefixtures("highest_precision")
def test_error_messages_name_the_fix():
    tx = so.scale_by_spectral_trust_ratio()
    with pytest.raises(ValueError, match=r"^scale_by_spectral_trust_ratio needs the parameters .*per layer\)"):
        tx.update({"w": jnp.ones((2, 2))}, tx.init(None))
    mup = so.mup_sgd(0.1, base={"Dense_0": {"kernel": np.zeros((2, 3))}})
    params = f32({"Dense_0": {"kernel": np.ones((4, 3))}, "Dense_1": {"kernel": np.ones((3, 3))}})
    with pytest.raises(so.GeometryError, match=r"'Dense_1/kernel' is missing from `base`: .*at the base width\), "
                                               r"e\.g\. base=model_at_base_width\.init\(key, x\)\['params'\]$"):
        mup.update(params, mup.init(params), params)


@pytest.mark.usefixtures("highest_precision")
def test_unknown_attribute_error_names_the_attribute():
    """``so.<missing>`` raises AttributeError naming the module and the attribute."""
    with pytest.raises(AttributeError, match=r"module 'spectral_optax' has no attribute 'no_such_thing'"):
        so.no_such_thing  # noqa: B018
