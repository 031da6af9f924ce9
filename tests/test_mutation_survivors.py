"""Tests written for the mutants that survived the mutation run (docs/reliability.md).

Each test pins down wiring that no other test checked: an option that must
reach the code that uses it (``geometry=`` of ``moga_labels``, of the trust
ratio, of ``moga``'s decay mask; ``mu_dtype``), the documented skip of a
literal-zero weight decay, and the shapes of the zero updates of frozen
leaves. Expected numbers come from float64 NumPy written here.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

pytestmark = pytest.mark.usefixtures("highest_precision")

STACKED = {r"blocks/w$": {"kind": "matrix", "fan_in_axes": (1,), "fan_out_axes": (2,)}}


def f32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


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


@pytest.mark.parametrize("name", ["moga", "spectral_sgd", "mup_sgd", "mup_adamw", "rescaled_adamw"])
def test_literal_zero_weight_decay_needs_no_params(name):
    """A literal 0 weight decay adds no decay transform (documented), so, as ``optax.adam``,
    ``update`` works without ``params``; any other value needs them."""
    make = {"moga": so.moga, "spectral_sgd": so.spectral_sgd, "mup_sgd": so.mup_sgd, "mup_adamw": so.mup_adamw,
            "rescaled_adamw": so.rescaled_adamw}[name]
    rng = np.random.default_rng(0)
    params = f32({"Dense_0": {"kernel": rng.standard_normal((4, 6)), "bias": rng.standard_normal(6)}})
    grads = f32({"Dense_0": {"kernel": rng.standard_normal((4, 6)), "bias": rng.standard_normal(6)}})
    tx = make(0.1, weight_decay=0.0)
    state = tx.init(params)
    without, _ = tx.update(grads, state, None)
    with_params, _ = tx.update(grads, state, params)
    jax.tree.map(np.testing.assert_array_equal, without, with_params)
    decayed = make(0.1, weight_decay=0.1)
    with pytest.raises(ValueError):
        decayed.update(grads, decayed.init(params), None)


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


def trust_ratio_reference(u, w, k, c=1.0):
    """Per slice: ``u * c ||w||_F / (sqrt(k) ||u||_F)`` (float64)."""
    nu = np.linalg.norm(u, axis=(-2, -1), keepdims=True)
    nw = np.linalg.norm(w, axis=(-2, -1), keepdims=True)
    return u * c * nw / (np.sqrt(k) * nu)


def test_trust_ratio_reads_the_geometry_override():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 4, 6))
    u = rng.standard_normal((3, 4, 6))
    tx = so.scale_by_spectral_trust_ratio(trust_coefficient=0.3, geometry=STACKED)
    got, _ = tx.update(f32({"blocks": {"w": u}}), tx.init(f32({"blocks": {"w": w}})), f32({"blocks": {"w": w}}))
    np.testing.assert_allclose(np.asarray(got["blocks"]["w"]), trust_ratio_reference(u, w, k=4, c=0.3),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_ema_momentum_stores_mu_in_mu_dtype(nesterov):
    """``mu_dtype=bfloat16``: the state is bf16, rounded after every step; the output keeps
    the gradient's float32 dtype (float64 reference with the same rounding)."""
    rng = np.random.default_rng(3)
    gs = [rng.standard_normal((5, 4)) for _ in range(3)]
    beta = 0.8
    tx = so.ema_momentum(beta, nesterov=nesterov, mu_dtype=jnp.bfloat16)
    state = tx.init({"w": jnp.zeros((5, 4), jnp.float32)})
    assert state.mu["w"].dtype == jnp.bfloat16
    mu = np.zeros((5, 4))
    for g in gs:
        out, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        g32 = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        new = beta * mu + (1 - beta) * g32
        want = beta * new + (1 - beta) * g32 if nesterov else new
        mu = np.asarray(jnp.asarray(new, jnp.bfloat16), np.float64)
        assert state.mu["w"].dtype == jnp.bfloat16 and out["w"].dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(state.mu["w"], np.float64), mu, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out["w"]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["muon", "contrib_muon", "moga", "rescaled_adamw"])
def test_mu_dtype_reaches_every_route(name):
    """``mu_dtype``: every EMA momentum and every Adam first moment, on every route, is stored
    in it (Adam's second moment stays float32, as in ``optax.adamw``)."""
    make = {"muon": lambda: so.muon(0.1, mu_dtype=jnp.bfloat16),
            "contrib_muon": lambda: so.contrib_muon(0.1, mu_dtype=jnp.bfloat16),
            "moga": lambda: so.moga(0.1, mu_dtype=jnp.bfloat16, rules={r"bias$": "adam"}),
            "rescaled_adamw": lambda: so.rescaled_adamw(0.1, mu_dtype=jnp.bfloat16)}[name]
    params = f32({"Dense_0": {"kernel": np.ones((4, 6)), "bias": np.ones(6)}})
    state = make().init(params)
    kinds = (so.expert.EmaMomentumState, optax.ScaleByAdamState, optax.contrib.MuonState)
    nodes = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kinds)) if isinstance(s, kinds)]
    mus = [x for s in nodes for x in jax.tree.leaves(s.mu) if x.shape in ((4, 6), (6,))]
    nus = [x for s in nodes if isinstance(s, optax.ScaleByAdamState) for x in jax.tree.leaves(s.nu)
           if x.shape in ((4, 6), (6,))]
    assert len(mus) >= 2 and nus
    assert all(x.dtype == jnp.bfloat16 for x in mus), [x.dtype for x in mus]
    assert all(x.dtype == jnp.float32 for x in nus)


@pytest.mark.parametrize("nesterov", [False, True])
def test_ema_momentum_bias_correction_over_steps(nesterov):
    """``bias_correction=True`` (``optax.contrib.muon``'s form), float64 reference over 4 steps:
    ``mu_t / (1 - b^t)``, or with Nesterov ``b mu_t / (1 - b^(t+1)) + (1 - b) g_t / (1 - b^t)``."""
    rng = np.random.default_rng(4)
    beta = 0.7
    tx = so.ema_momentum(beta, nesterov=nesterov, bias_correction=True)
    state = tx.init({"w": jnp.zeros((3, 4), jnp.float32)})
    mu = np.zeros((3, 4))
    for t in range(1, 5):
        g = rng.standard_normal((3, 4))
        out, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        mu = beta * mu + (1 - beta) * g
        if nesterov:
            want = beta * mu / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)
        else:
            want = mu / (1 - beta**t)
        assert int(state.count) == t
        np.testing.assert_allclose(np.asarray(out["w"]), want, rtol=1e-5, atol=1e-6)


def test_trust_ratio_zero_update_slice_stays_zero_with_min_norm():
    """A slice whose update is 0 passes through (ratio 1, as ``optax.scale_by_trust_ratio``),
    also when ``min_norm > 0`` floors its norm; the other slice gets the float64 ratio."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 4, 6))
    u = rng.standard_normal((2, 4, 6))
    u[0] = 0.0
    tx = so.scale_by_spectral_trust_ratio(min_norm=1e-3, geometry=STACKED)
    got, _ = tx.update(f32({"blocks": {"w": u}}), tx.init(None), f32({"blocks": {"w": w}}))
    got = np.asarray(got["blocks"]["w"])
    assert np.all(got[0] == 0.0)
    np.testing.assert_allclose(got[1], trust_ratio_reference(u[1:], w[1:], k=4)[0], rtol=1e-5, atol=1e-6)


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


def test_contrib_muon_adam_eps_root_matches_optax_contrib():
    rng = np.random.default_rng(9)
    params = {"a": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
              "c": jnp.asarray(rng.standard_normal((5,)), jnp.float32)}
    kw = {"adam_eps_root": 1e-2}
    outs = []
    for tx in (optax.contrib.muon(0.05, **kw), so.contrib_muon(0.05, **kw)):
        p, s = params, tx.init(params)
        for i in range(3):
            g = jax.tree.map(lambda x, i=i: jnp.asarray(np.random.default_rng(i).standard_normal(x.shape),
                                                        jnp.float32), params)
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        outs.append(p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outs[1], outs[0])
    plain = so.contrib_muon(0.05)  # eps_root matters on this tree
    p, s = params, plain.init(params)
    for i in range(3):
        g = jax.tree.map(lambda x, i=i: jnp.asarray(np.random.default_rng(i).standard_normal(x.shape),
                                                    jnp.float32), params)
        u, s = plain.update(g, s, p)
        p = optax.apply_updates(p, u)
    assert not np.allclose(p["c"], outs[0]["c"], rtol=1e-6)


def test_error_messages_name_the_fix():
    tx = so.scale_by_spectral_trust_ratio()
    with pytest.raises(ValueError, match=r"^scale_by_spectral_trust_ratio needs the parameters .*per layer\)"):
        tx.update({"w": jnp.ones((2, 2))}, tx.init(None))
    mup = so.mup_sgd(0.1, base={"Dense_0": {"kernel": np.zeros((2, 3))}})
    params = f32({"Dense_0": {"kernel": np.ones((4, 3))}, "Dense_1": {"kernel": np.ones((3, 3))}})
    with pytest.raises(so.GeometryError, match=r"'Dense_1/kernel' is missing from `base`: .*at the base width\), "
                                               r"e\.g\. base=model_at_base_width\.init\(key, x\)\['params'\]$"):
        mup.update(params, mup.init(params), params)


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


def test_contrib_muon_eps_reaches_the_adamw_route():
    """``eps`` is also AdamW's epsilon (as in contrib): with a large one the non-matrix leaves
    match ``optax.contrib.muon`` and differ from the default (contrib also adds ``eps`` to the
    Frobenius norm before Newton-Schulz, which this does not, so matrices are not compared)."""
    rng = np.random.default_rng(13)
    params = {"a": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
              "c": jnp.asarray(rng.standard_normal((5,)), jnp.float32),
              "d": jnp.asarray(rng.standard_normal((2, 3, 2)), jnp.float32)}
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), params)
             for _ in range(3)]

    def trajectory(tx):
        p, s = params, tx.init(params)
        for g in grads:
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        return p

    want = trajectory(optax.contrib.muon(0.05, eps=0.3))
    got = trajectory(so.contrib_muon(0.05, eps=0.3))
    default = trajectory(so.contrib_muon(0.05))
    for k in ("c", "d"):
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(default[k]), np.asarray(want[k]), rtol=1e-4)


def test_batched_orthogonalization_is_one_call_split_back():
    """Same-shape matrices are stacked into one call of the iteration and split back in order.
    (The padding to the owners / split sizes of a mesh now lives in the plan; tests/test_pod_plan.py
    checks it against a float64 reference on 16 devices.)"""
    from spectral_optax._transforms.orthogonalize import _batched

    rng = np.random.default_rng(14)
    mats = [jnp.asarray(rng.standard_normal((n, 3, 5)), jnp.float32) for n in (2, 1, 2)]
    seen = []

    def iteration(stacked):
        seen.append(stacked)
        return stacked * 2.0 + jnp.arange(stacked.shape[0], dtype=stacked.dtype)[:, None, None]

    blocks = _batched(mats, iteration)
    assert len(seen) == 1 and seen[0].shape == (5, 3, 5)
    assert [b.shape for b in blocks] == [(2, 3, 5), (1, 3, 5), (2, 3, 5)]
    offset = 0
    for b, m in zip(blocks, mats):  # each block is its own slices of the one result, in order
        ref = 2.0 * np.asarray(m) + np.arange(offset, offset + m.shape[0])[:, None, None]
        np.testing.assert_allclose(np.asarray(b), ref, rtol=1e-6)
        offset += m.shape[0]
