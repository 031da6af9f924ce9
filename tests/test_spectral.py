"""scale_by_spectral_norm and spectral_sgd against float64 NumPy SVD."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spectral_optax as so
from spectral_optax import Geometry

SHAPES = {
    "square": Geometry.matrix((24, 24)),
    "wide": Geometry.matrix((12, 40)),
    "tall": Geometry.matrix((40, 12)),
    "conv": Geometry((3, 3, 4, 6), "matrix", (0, 1, 2), (3,)),
    "stacked": Geometry((5, 16, 8), "matrix", (1,), (2,)),
}


def slices64(x, g):
    """Reference matrix view in float64 NumPy (independent of to_matrix)."""
    x = np.asarray(x, np.float64)
    x = np.moveaxis(x, g.batch_axes + g.fan_in_axes + g.fan_out_axes, range(x.ndim))
    return x.reshape(-1, g.d_in, g.d_out)


def rank1(g, key):
    k1, k2 = jax.random.split(key)
    n_b = g.num_slices
    u = np.asarray(jax.random.normal(k1, (n_b, g.d_in)), np.float64)
    v = np.asarray(jax.random.normal(k2, (n_b, g.d_out)), np.float64)
    m = np.einsum("bi,bo->bio", u, v)
    perm = g.batch_axes + g.fan_in_axes + g.fan_out_axes
    return np.moveaxis(m.reshape([g.shape[a] for a in perm]), range(len(perm)), perm)


def apply(tx, grads, steps=1):
    params = jax.tree.map(jnp.zeros_like, grads)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(steps):
        out, state = update(grads, state, params)
    return out


@pytest.mark.parametrize("method", ["frobenius", "power"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_rank1_gradient_gets_exact_target_spectral_norm(name, method):
    g = SHAPES[name]
    grad = jnp.asarray(rank1(g, jax.random.key(3)), jnp.float32)
    tx = so.scale_by_spectral_norm(method=method, geometry={"w": g})
    out = apply(tx, {"w": grad})["w"]
    sv = np.linalg.svd(slices64(out, g), compute_uv=False)
    np.testing.assert_allclose(sv[:, 0], np.sqrt(g.d_out / g.d_in), rtol=1e-5)
    assert np.all(sv[:, 1:] < 1e-4 * sv[:, :1])


@pytest.mark.parametrize("name", list(SHAPES))
def test_full_rank_frobenius_and_power(name):
    g = SHAPES[name]
    grad = jax.random.normal(jax.random.key(0), g.shape)
    ref = slices64(grad, g)
    target = np.sqrt(g.d_out / g.d_in)
    out = apply(so.scale_by_spectral_norm(geometry={"w": g}), {"w": grad})["w"]
    m = slices64(out, g)
    # Frobenius stand-in: Frobenius norm = target, direction unchanged.
    np.testing.assert_allclose(np.linalg.norm(m, axis=(1, 2)), target, rtol=1e-5)
    np.testing.assert_allclose(m, ref / np.linalg.norm(ref, axis=(1, 2), keepdims=True) * target, rtol=1e-4, atol=1e-6)

@pytest.mark.parametrize("name", list(SHAPES))
def test_power_iteration_reaches_exact_spectral_norm(name):
    # Gradients have decaying spectra (low stable rank): plant sigma_k = 0.7^k.
    g = SHAPES[name]
    rng = np.random.default_rng(1)
    r = min(g.d_in, g.d_out)
    mats = []
    for _ in range(g.num_slices):
        u, _ = np.linalg.qr(rng.normal(size=(g.d_in, r)))
        v, _ = np.linalg.qr(rng.normal(size=(g.d_out, r)))
        mats.append(u @ np.diag(0.7 ** np.arange(r)) @ v.T)
    m = np.stack(mats)
    perm = g.batch_axes + g.fan_in_axes + g.fan_out_axes
    grad = np.moveaxis(m.reshape([g.shape[a] for a in perm]), range(len(perm)), perm)
    tx = so.scale_by_spectral_norm(method="power", geometry={"w": g})
    out = apply(tx, {"w": jnp.asarray(grad, jnp.float32)}, steps=3)["w"]
    sv = np.linalg.svd(slices64(out, g), compute_uv=False)
    np.testing.assert_allclose(sv[:, 0], np.sqrt(g.d_out / g.d_in), rtol=1e-4)
    # Frobenius stand-in on the same gradient undershoots by sqrt(stable rank).
    out = apply(so.scale_by_spectral_norm(geometry={"w": g}), {"w": jnp.asarray(grad, jnp.float32)})["w"]
    stable_rank = np.sum(0.49 ** np.arange(r))
    sv = np.linalg.svd(slices64(out, g), compute_uv=False)
    np.testing.assert_allclose(sv[:, 0], np.sqrt(g.d_out / g.d_in / stable_rank), rtol=1e-4)


def test_embedding_and_vector_rules():
    grads = {
        "Embed_0": {"embedding": jnp.concatenate([jax.random.normal(jax.random.key(1), (5, 8)), jnp.zeros((3, 8))])},
        "Dense_0": {"bias": jax.random.normal(jax.random.key(2), (8,)) * 1e-3},
    }
    out = apply(so.scale_by_spectral_norm(), grads)
    e = np.asarray(out["Embed_0"]["embedding"], np.float64)
    np.testing.assert_allclose(np.sqrt((e[:5] ** 2).mean(axis=1)), 1.0, rtol=1e-5)
    assert np.all(e[5:] == 0)
    b = np.asarray(out["Dense_0"]["bias"], np.float64)
    np.testing.assert_allclose(np.sqrt((b**2).mean()), 1.0, rtol=1e-5)


@pytest.mark.parametrize("method", ["frobenius", "power"])
@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e30])
def test_zero_tiny_huge_gradients_finite(method, scale):
    base = jax.random.normal(jax.random.key(4), (16, 8))
    grads = {"Dense_0": {"kernel": base * scale, "bias": jnp.ones((8,)) * scale}}
    out = apply(so.scale_by_spectral_norm(method=method), grads, steps=2)
    for x in jax.tree.leaves(out):
        assert np.all(np.isfinite(np.asarray(x)))
    k = slices64(out["Dense_0"]["kernel"], Geometry.matrix((16, 8)))
    if scale == 0.0:
        assert np.all(k == 0)
    elif method == "frobenius":
        np.testing.assert_allclose(np.linalg.norm(k), np.sqrt(8 / 16), rtol=1e-5)


def test_spectral_sgd_matches_reference_and_keeps_bf16():
    params = {"Dense_0": {"kernel": jnp.ones((16, 8), jnp.bfloat16), "bias": jnp.zeros((8,), jnp.bfloat16)}}
    tx = so.spectral_sgd(0.5, momentum=0.9)
    state = tx.init(params)
    rng = np.random.default_rng(0)
    momentum = np.zeros((16, 8))
    for _ in range(3):
        grad = rng.normal(size=(16, 8))
        grads = {"Dense_0": {"kernel": jnp.asarray(grad, jnp.bfloat16), "bias": jnp.ones((8,), jnp.bfloat16)}}
        updates, state = jax.jit(tx.update)(grads, state, params)
        momentum = 0.9 * momentum + np.asarray(grads["Dense_0"]["kernel"], np.float64)
    assert updates["Dense_0"]["kernel"].dtype == jnp.bfloat16
    new = optax.apply_updates(params, updates)
    assert new["Dense_0"]["kernel"].dtype == jnp.bfloat16
    expected = -0.5 * np.sqrt(8 / 16) * momentum / np.linalg.norm(momentum)
    np.testing.assert_allclose(np.asarray(updates["Dense_0"]["kernel"], np.float64), expected, rtol=2e-2, atol=2e-3)


def test_spectral_sgd_schedule_and_inject_hyperparams():
    params = {"Dense_0": {"kernel": jnp.zeros((4, 4))}}
    grads = {"Dense_0": {"kernel": jnp.eye(4)}}
    sched = optax.linear_schedule(1.0, 0.0, 4)
    tx = so.spectral_sgd(sched, momentum=None)
    state = tx.init(params)
    norms = []
    for _ in range(3):
        u, state = tx.update(grads, state, params)
        norms.append(float(jnp.linalg.norm(u["Dense_0"]["kernel"])))
    np.testing.assert_allclose(norms, [1.0, 0.75, 0.5], rtol=1e-5)  # ||eye/2||_F * sqrt(4/4) * lr
    tx = optax.inject_hyperparams(so.spectral_sgd)(learning_rate=0.1, momentum=0.5)
    state = tx.init(params)
    u, state = jax.jit(tx.update)(grads, state, params)
    np.testing.assert_allclose(float(jnp.linalg.norm(u["Dense_0"]["kernel"])), 0.1, rtol=1e-5)
    state.hyperparams["learning_rate"] = jnp.asarray(0.2)
    u, state = jax.jit(tx.update)(grads, state, params)
    np.testing.assert_allclose(float(jnp.linalg.norm(u["Dense_0"]["kernel"])), 0.2, rtol=1e-5)


def f32(a):
    return jnp.asarray(a, jnp.float32)


@pytest.mark.usefixtures("highest_precision")
def test_spectral_sgd_decay_mask_reads_the_geometry():
    """A leaf declared a vector by geometry= is spared by spectral_sgd's default decay mask."""
    params = {"Dense_0": {"kernel": f32(np.arange(24.0).reshape(4, 6) / 10), "bias": f32(np.ones(6))}}
    grads = jax.tree.map(jnp.zeros_like, params)
    tx = so.spectral_sgd(1.0, weight_decay=0.5, geometry={r"Dense_0/kernel$": {"kind": "vector"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(np.asarray(out["Dense_0"]["kernel"]), 0.0)
    np.testing.assert_array_equal(np.asarray(out["Dense_0"]["bias"]), 0.0)
    plain = so.spectral_sgd(1.0, weight_decay=0.5)
    out, _ = plain.update(grads, plain.init(params), params)
    np.testing.assert_allclose(np.asarray(out["Dense_0"]["kernel"]), -0.5 * np.asarray(params["Dense_0"]["kernel"]))


@pytest.mark.usefixtures("highest_precision")
def test_spectral_norm_state_is_replicated_on_the_params_mesh():
    """init of scale_by_spectral_norm puts its vectors on the params' mesh (NamedSharding, replicated)."""
    mesh = jax.make_mesh((1,), ("x",))
    params = {"Dense_0": {"kernel": jax.device_put(jnp.ones((4, 6)), NamedSharding(mesh, P("x")))}}
    state = so.scale_by_spectral_norm(method="power").init(params)
    sharding = state.right_vectors.sharding
    assert isinstance(sharding, NamedSharding) and sharding.spec == P() and sharding.mesh.axis_names == ("x",)


def _with_spectrum(rng, m, n, sigmas):
    u, _ = np.linalg.qr(rng.standard_normal((m, len(sigmas))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(sigmas))))
    return (u * np.asarray(sigmas)) @ v.T


@pytest.mark.usefixtures("highest_precision")
def test_power_method_warm_starts_each_leaf_from_its_own_vector():
    """One power step per update is exact from the previous update's vector of the *same* leaf: three matrix
    leaves of different widths with close top singular values (1 : 0.9), the first update converged
    (``initial_power_iterations=200``), the second with one step on the same gradients must give each leaf
    ``sqrt(d_out / d_in) g / sigma_max`` (a start vector of another leaf, or a cold one, is off by > 1e-3)."""
    rng = np.random.default_rng(0)
    grads = {k: {"kernel": f32(_with_spectrum(rng, 4, n, [1.0, 0.9, 0.3]))} for k, n in (("a", 3), ("b", 5), ("c", 4))}
    tx = so.scale_by_spectral_norm(method="power", power_iterations=1, initial_power_iterations=200)
    _, state = tx.update(grads, tx.init(grads))
    out, _ = tx.update(grads, state)
    for k, leaf in grads.items():
        g = np.asarray(leaf["kernel"], np.float64)
        want = math.sqrt(g.shape[1] / g.shape[0]) * g / np.linalg.norm(g, 2)
        np.testing.assert_allclose(np.asarray(out[k]["kernel"]), want, rtol=1e-4, atol=1e-6)
    cold = so.scale_by_spectral_norm(method="power", power_iterations=1, initial_power_iterations=1)
    off, _ = cold.update(grads, cold.init(grads))
    g = np.asarray(grads["b"]["kernel"], np.float64)
    assert not np.allclose(np.asarray(off["b"]["kernel"]), math.sqrt(5 / 4) * g / np.linalg.norm(g, 2), rtol=1e-3)
