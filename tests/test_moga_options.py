"""``so.moga`` and ``so.rescaled_adamw``: the options that must reach the code using them (geometry overrides of the
labels, the decay mask and the head route; the ``rules``; injected ``p`` / ``q``), against float64 NumPy written here."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

STACKED = {r"blocks/w$": {"kind": "matrix", "fan_in_axes": (1,), "fan_out_axes": (2,)}}


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


@pytest.mark.usefixtures("highest_precision")
def test_moga_labels_read_geometry_and_rules():
    params = {"blocks": {"w": np.zeros((3, 4, 5))}, "Dense_0": {"kernel": np.zeros((4, 5))},
              "head": {"kernel": np.zeros((5, 2))}, "Embed_0": {"embedding": np.zeros((7, 4))}}
    labels = so.expert.moga_labels(variant="col", geometry=STACKED)(params)
    assert labels == {"blocks": {"w": "col"}, "Dense_0": {"kernel": "col"}, "head": {"kernel": "head"},
                      "Embed_0": {"embedding": "sign"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", so.GeometryWarning)  # no override: the 3-D leaf is element-wise
        default = so.expert.moga_labels()(params)
    assert default["blocks"]["w"] == "sign" and default["Dense_0"]["kernel"] == "row"
    custom = optax.identity()
    labels = so.expert.moga_labels(rules={r"Dense_0/": "adam", r"^head/": custom}, geometry=STACKED)(params)
    assert labels["Dense_0"]["kernel"] == "adam" and labels["head"]["kernel"] == "custom:^head/"
    assert labels["blocks"]["w"] == "row"


@pytest.mark.usefixtures("highest_precision")
def test_moga_decay_mask_reads_the_geometry_override():
    """A 2-D leaf declared a stacked vector by ``geometry=`` is spared by the default decay
    mask and gets ``sign`` of the EMA momentum: ``W <- W - lr sign(mu)`` (float64 reference)."""
    rng = np.random.default_rng(1)
    params = {"Dense_0": {"kernel": rng.standard_normal((4, 5))}, "blocks": {"gain": rng.standard_normal((3, 5))}}
    geometry = {r"blocks/gain$": so.Geometry.vector((3, 5), fan_out_axes=(1,))}
    grads = [jax.tree.map(lambda x: rng.standard_normal(x.shape), params) for _ in range(3)]
    lr, wd, beta = 0.01, 0.5, 0.9
    tx = so.moga(lr, momentum=beta, weight_decay=wd, geometry=geometry)
    p, state = f32(params), None
    state = tx.init(p)
    w, mu = params["blocks"]["gain"].copy(), np.zeros((3, 5))
    for g in grads:
        u, state = tx.update(f32(g), state, p)
        p = optax.apply_updates(p, u)
        mu = beta * mu + (1 - beta) * g["blocks"]["gain"]
        w = w - lr * np.sign(mu)
        np.testing.assert_allclose(np.asarray(p["blocks"]["gain"]), w, rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("variant", ["row", "col"])
def test_injected_p_equals_static(variant):
    """An injected (traced) ``p`` gives the update of ``p`` given at construction, in both
    variants (the column variant derives ``q = p / (p - 1)`` from it)."""
    rng = np.random.default_rng(6)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((5, 6))}})
    grads = [f32({"Dense_0": {"kernel": rng.standard_normal((5, 6))}}) for _ in range(2)]
    for value in (2.0, 1.5):  # (the special cases p = 1, 2 of the static path, traced)
        inj = optax.inject_hyperparams(so.moga)(learning_rate=0.01, p=3.0, variant=variant)
        st = inj.init(params)
        st.hyperparams["p"] = jnp.asarray(value, jnp.float32)
        u, _ = jax.jit(inj.update)(grads[0], st, params)  # under jit, p is traced
        ref = so.moga(0.01, p=value, variant=variant)
        v, _ = ref.update(grads[0], ref.init(params), params)
        np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), np.asarray(v["Dense_0"]["kernel"]),
                                   rtol=1e-5, atol=1e-8)
    injected = optax.inject_hyperparams(so.moga)(learning_rate=0.01, p=2.0, variant=variant)
    state = injected.init(params)
    state.hyperparams["p"] = jnp.asarray(3.0, jnp.float32)
    built = so.moga(0.01, p=3.0, variant=variant)
    s2 = built.init(params)
    update = jax.jit(injected.update)
    for g in grads:
        u, state = update(g, state, params)
        v, s2 = built.update(g, s2, params)
        np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), np.asarray(v["Dense_0"]["kernel"]),
                                   rtol=1e-5, atol=1e-8)
    # and the float64 dual: row, p = 3 (per fan-out column, over the fan-in axis, times d_in^(-1/3));
    # column, q* = p = 3 (q = 3/2; per fan-in row, times d_out^(1/q) / d_in). First step: mu = (1 - b) g.
    h = np.asarray(grads[0]["Dense_0"]["kernel"], np.float64)
    axis, fan = (0, 5 ** (-1 / 3)) if variant == "row" else (1, 6 ** (1 / 1.5) / 5)
    d = np.sign(h) * np.abs(h) ** 2 / np.sum(np.abs(h) ** 3, axis=axis, keepdims=True) ** (2 / 3)
    want = -0.01 * 25.0 * d * fan
    v0, _ = so.moga(0.01, p=3.0, variant=variant).update(grads[0], built.init(params), params)
    np.testing.assert_allclose(np.asarray(v0["Dense_0"]["kernel"]), want, rtol=1e-4, atol=1e-7)


@pytest.mark.usefixtures("highest_precision")
def test_rescaled_adamw_static_p_with_injected_q():
    """``inject_hyperparams(..., static_args=('p',))``: a static ``p`` with a traced ``q``."""
    rng = np.random.default_rng(7)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((4, 9))}})
    g = f32({"Dense_0": {"kernel": rng.standard_normal((4, 9))}})
    injected = optax.inject_hyperparams(so.rescaled_adamw, static_args=("p",))(0.01, p=2.0, q=3.0)
    u, _ = jax.jit(injected.update)(g, injected.init(params), params)  # under jit, q is traced
    # First Adam step: m / (sqrt(v) + eps) = g / (|g| + eps) ~ sign(g); factor d_out^(1/q) / d_in^(1/p).
    g64 = np.asarray(g["Dense_0"]["kernel"], np.float64)
    adam = g64 / (np.abs(g64) + 1e-8)
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    want = -0.01 * (9 ** (1 / 3) / 4 ** (1 / 2) * adam + 1e-4 * w)
    np.testing.assert_allclose(np.asarray(u["Dense_0"]["kernel"]), want, rtol=1e-5, atol=1e-8)


@pytest.mark.usefixtures("highest_precision")
def test_moga_head_route_reads_the_geometry_override():
    """A stacked (3, 4, 5) head declared by override: each slice's fan-in vectors get the
    ``'head'`` rule, ``mu_i / ||mu_i||_2`` for ``p = 2`` (float64 reference over 3 steps)."""
    rng = np.random.default_rng(8)
    params = {"head": {"w": rng.standard_normal((3, 4, 5))}}
    geometry = {r"head/w$": {"kind": "matrix", "fan_in_axes": (1,), "fan_out_axes": (2,), "role": "output"}}
    tx = so.moga(0.02, p=2.0, momentum=0.8, geometry=geometry)
    p = f32(params)
    state = tx.init(p)
    w, mu = params["head"]["w"].copy(), np.zeros((3, 4, 5))
    for _ in range(3):
        g = rng.standard_normal((3, 4, 5))
        u, state = tx.update(f32({"head": {"w": g}}), state, p)
        p = optax.apply_updates(p, u)
        mu = 0.8 * mu + 0.2 * g
        w = w - 0.02 * mu / np.linalg.norm(mu, axis=1, keepdims=True)
        np.testing.assert_allclose(np.asarray(p["head"]["w"]), w, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")
def test_moga_adam_rule_documented_defaults():
    """The ``'adam'`` rule with the defaults: Adam with ``b1 = momentum = 0.95``, ``b2 = 0.999``,
    ``eps = 1e-8``, bias-corrected, times ``-learning_rate`` (float64 reference, 4 steps)."""
    rng = np.random.default_rng(10)
    w0 = rng.standard_normal((4, 6))
    tx = so.moga(0.01, rules={r"kernel$": "adam"})
    p = f32({"Dense_0": {"kernel": w0}})
    state = tx.init(p)
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t in range(1, 5):
        g = rng.standard_normal((4, 6)) * 10.0 ** rng.uniform(-3, 0)
        u, state = tx.update(f32({"Dense_0": {"kernel": g}}), state, p)
        p = optax.apply_updates(p, u)
        g = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        m = 0.95 * m + 0.05 * g
        v = 0.999 * v + 0.001 * g * g
        w = w - 0.01 * (m / (1 - 0.95**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(np.asarray(p["Dense_0"]["kernel"]), w, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("b", [0.2, 5.0])
def test_base_factor_is_the_whole_route_balance(b):
    """``base_factor`` is MOGA's whole balance between the hidden rows and every other route (issue 50, item 4;
    ``lab.third_party.MOGA_VARIANTS``): the other routes (read-out, sign on tables and vectors) scaled by ``b``
    equal ``base_factor / b`` at learning rate ``x b``; on the sign routes the step is ``b * lr * sign(g)``
    (float64 NumPy), on the hidden rows it does not change."""
    rng = np.random.default_rng(0)
    params = {"Embed_0": {"embedding": rng.normal(size=(11, 8))}, "Dense_0": {"kernel": rng.normal(size=(8, 16)),
              "bias": rng.normal(size=(16,))}, "head": {"kernel": rng.normal(size=(16, 11))}}
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape), params)
    geometry = {r"^head/": {"role": "output"}}
    lr, bf = 0.01, 20.0
    balanced = optax.chain(
        so.moga(lr, base_factor=bf, geometry=geometry),
        so.route_lr_scale(output=b, embedding=b, vector=b, geometry=geometry),
    )
    moved = so.moga(lr * b, base_factor=bf / b, geometry=geometry)
    base = so.moga(lr, base_factor=bf, geometry=geometry)
    p32, g32 = f32(params), f32(grads)
    u_bal = balanced.update(g32, balanced.init(p32), p32)[0]
    u_mov = moved.update(g32, moved.init(p32), p32)[0]
    u_base = base.update(g32, base.init(p32), p32)[0]
    for path, x, y in zip(jax.tree_util.tree_leaves_with_path(u_bal), jax.tree.leaves(u_mov), jax.tree.leaves(u_base)):
        np.testing.assert_allclose(np.asarray(path[1]), np.asarray(x), rtol=1e-5, atol=1e-9, err_msg=str(path[0]))
    np.testing.assert_allclose(np.asarray(u_bal["Embed_0"]["embedding"]), -b * lr * np.sign(grads["Embed_0"]["embedding"]),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u_bal["Dense_0"]["bias"]), -b * lr * np.sign(grads["Dense_0"]["bias"]),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u_bal["Dense_0"]["kernel"]), np.asarray(u_base["Dense_0"]["kernel"]),
                               rtol=1e-5)
