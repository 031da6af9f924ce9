"""Tests written for the mutants that survived mutation testing of spectral_optax/_mesh/layout.py,
_transforms/*.py, _optimizers/*.py, initializers.py, _depth.py and __init__.py (see docs/reliability.md,
"Mutation testing").

They pin down error messages that name the fix, edge cases (one block, several sown values, an explicit
``input_norm``), the warm-start bookkeeping of the power method, dtypes, and the sharding wiring that a
one-device mesh (``Explicit`` axes, ``shard_map``) or a traced program (``make_jaxpr``) shows. Expected
numbers come from float64 NumPy written here.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spectral_optax as so
from spectral_optax._geometry import Geometry
from spectral_optax._mesh import layout as mesh_lib

pytestmark = pytest.mark.usefixtures("highest_precision")


def f32(a):
    return jnp.asarray(a, jnp.float32)


def explicit_mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))


# --------------------------------------------------------------------------
# Depth scaling.
# --------------------------------------------------------------------------
def test_residual_alpha_accepts_a_single_block():
    """One residual block is a valid depth: alpha = K_base / 1."""
    assert so.residual_alpha(1) == 2.0
    assert so.residual_alpha(1, 4, exponent=0.5) == 2.0
    with pytest.raises(ValueError, match="num_blocks must be a positive integer"):
        so.residual_alpha(0)


def test_depth_mask_of_wrong_structure_names_the_fix():
    """A mask tree that is not shaped like the params: the error names the transform and the regex fix."""
    params = {"blocks": {"dense_1": {"kernel": jnp.ones((2, 2))}}, "head": {"kernel": jnp.ones((2, 2))}}
    tx = so.depth_residual_scale(4, mask={"blocks": True})
    with pytest.raises(so.GeometryError, match=r"depth_residual_scale: the mask tree does not have the structure"):
        tx.init(params)


def test_scale_init_forwards_extra_positional_arguments():
    """scale_init passes the initializer's extra positional arguments through."""

    def init(key, shape, dtype, fill):
        return jnp.full(shape, fill, dtype)

    out = so.expert.scale_init(init, 0.5)(jax.random.key(0), (2, 3), jnp.float32, 3.0)
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 3), 1.5, np.float32))


# --------------------------------------------------------------------------
# Initializers and the package's __getattr__.
# --------------------------------------------------------------------------
def test_initializer_shape_errors_name_the_fix():
    """A 0-D embedding shape and a 1-D weight shape: errors say what shape is needed (lowercase argument names)."""
    with pytest.raises(ValueError, match=r"embedding table needs at least one axis, typically \(vocab, features\)"):
        so.initializers.spectral_embedding()(jax.random.key(0), ())
    with pytest.raises(ValueError, match=r"out_axis=\(-2, -1\); stacked \(layers, in, out\): batch_axis=0"):
        so.initializers.spectral_normal()(jax.random.key(0), (4,))


def test_unknown_attribute_error_names_the_attribute():
    """``so.<missing>`` raises AttributeError naming the module and the attribute."""
    with pytest.raises(AttributeError, match=r"module 'spectral_optax' has no attribute 'no_such_thing'"):
        so.no_such_thing  # noqa: B018


# --------------------------------------------------------------------------
# QK-clip.
# --------------------------------------------------------------------------
def test_collect_max_logits_takes_the_max_of_several_sown_values():
    """Several values sown by one module (a tuple) give their elementwise max."""
    inter = {"intermediates": {"attn": {"max_logits": (f32([1.0, 5.0, 2.0]), f32([3.0, 0.5, 2.5]))}}}
    got = so.collect_max_logits(inter)
    assert set(got) == {"attn"}
    np.testing.assert_array_equal(np.asarray(got["attn"]), [3.0, 5.0, 2.5])


def _qk_params(d=8, n=2, h=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "attn": {
            "query": {"kernel": f32(rng.standard_normal((d, n, h))), "bias": f32(rng.standard_normal((n, h)))},
            "key": {"kernel": f32(rng.standard_normal((d, n, h))), "bias": f32(rng.standard_normal((n, h)))},
        }
    }


def test_qk_logit_bound_uses_the_given_input_norm():
    """``input_norm=r``: the bound is ||W_q^h W_k^h^T||_2 r^2 / sqrt(d_h) (float64 SVD)."""
    params = _qk_params()
    got = so.diagnostics.qk_logit_bound(params, input_norm=2.0)["attn"]
    wq = np.asarray(params["attn"]["query"]["kernel"], np.float64)
    wk = np.asarray(params["attn"]["key"]["kernel"], np.float64)
    want = [np.linalg.norm(wq[:, h, :] @ wk[:, h, :].T, 2) * 4.0 / 2.0 for h in range(2)]
    np.testing.assert_allclose(np.asarray(got).reshape(-1), want, rtol=1e-4)


def test_qk_clip_empty_bias_path_means_no_bias():
    """AttentionSpec(query_bias='', key_bias=''): the biases are left alone, only the kernels are clipped."""
    params = _qk_params()
    upd = jax.tree.map(jnp.zeros_like, params)
    spec = so.AttentionSpec(query="attn/query/kernel", key="attn/key/kernel", query_bias="", key_bias="")
    tx = so.qk_clip(1.0, attention={"attn": spec})
    out, _ = tx.update(upd, tx.init(params), params, max_logits={"attn": f32([4.0, 0.5])})
    # head 0: gamma = 1/4, factor 1/2: new = p / 2, update = -p / 2; head 1 untouched
    for side in ("query", "key"):
        p = np.asarray(params["attn"][side]["kernel"], np.float64)
        want = np.zeros_like(p)
        want[:, 0, :] = -p[:, 0, :] / 2
        np.testing.assert_allclose(np.asarray(out["attn"][side]["kernel"]), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(out["attn"][side]["bias"]), 0.0)


def test_qk_clip_on_an_explicit_one_device_mesh():
    """On an Explicit mesh (one device) qk_clip gives the float64 values and keeps the parameters' shardings."""
    mesh = explicit_mesh()
    params = _qk_params()
    rng = np.random.default_rng(1)
    upd = jax.tree.map(lambda p: f32(0.01 * rng.standard_normal(p.shape)), params)
    logits = f32([4.0, 0.5])
    with jax.set_mesh(mesh):
        put = lambda t, s: jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, s)), t)
        ps, us = put(params, P("x")), put(upd, P("x"))
        ls = jax.device_put(logits, NamedSharding(mesh, P("x")))
        tx = so.qk_clip(1.0)
        out = jax.jit(lambda u, p, s: tx.update(u, tx.init(p), p, max_logits={"attn": s})[0])(us, ps, ls)
    for side in ("query", "key"):
        for leaf in ("kernel", "bias"):
            p = np.asarray(params["attn"][side][leaf], np.float64)
            u = np.asarray(upd["attn"][side][leaf], np.float64)
            want = u.copy()
            sl = (slice(None), 0) if leaf == "kernel" else (0,)
            want[sl] = (p[sl] + u[sl]) / 2 - p[sl]
            got = out["attn"][side][leaf]
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
            assert jax.typeof(got).sharding.spec == jax.typeof(us["attn"][side][leaf]).sharding.spec


# --------------------------------------------------------------------------
# Spectral SGD and scale_by_spectral_norm.
# --------------------------------------------------------------------------
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


def test_spectral_norm_state_is_replicated_on_the_params_mesh():
    """init of scale_by_spectral_norm puts its vectors on the params' mesh (NamedSharding, replicated)."""
    mesh = jax.make_mesh((1,), ("x",))
    params = {"Dense_0": {"kernel": jax.device_put(jnp.ones((4, 6)), NamedSharding(mesh, P("x")))}}
    state = so.scale_by_spectral_norm(method="power").init(params)
    sharding = state.right_vectors.sharding
    assert isinstance(sharding, NamedSharding) and sharding.spec == P() and sharding.mesh.axis_names == ("x",)


def test_power_method_reads_each_leafs_own_warm_start_vector():
    """The warm-start vectors are read at the running offset of each matrix leaf (three leaves).

    Leaf c's gradient has rank 1 along e_0; its own start vector is e_0 (one power step is exact),
    while the slice one leaf earlier is orthogonal to e_0 (it would give sigma = 0)."""
    rng = np.random.default_rng(0)
    col = rng.standard_normal(4)
    gc = np.zeros((4, 5))
    gc[:, 0] = col
    grads = {
        "a": {"kernel": f32(rng.standard_normal((4, 2)))},
        "b": {"kernel": f32(rng.standard_normal((4, 3)))},
        "c": {"kernel": f32(gc)},
    }
    vec = np.ones(10, np.float32)  # a: [0, 2), b: [2, 5), c: [5, 10)
    vec[3] = 0.0
    vec[5:] = [1.0, 0.0, 0.0, 0.0, 0.0]
    tx = so.scale_by_spectral_norm(method="power", power_iterations=1, initial_power_iterations=1)
    state = tx.init(grads)._replace(count=jnp.ones([], jnp.int32), right_vectors=f32(vec))
    out, _ = tx.update(grads, state)
    want = math.sqrt(5 / 4) * gc / np.linalg.norm(col)
    np.testing.assert_allclose(np.asarray(out["c"]["kernel"]), want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# NorMuon's neuron second moments.
# --------------------------------------------------------------------------
def test_neuron_second_moment_keeps_bfloat16_updates():
    """scale_by_neuron_second_moment returns updates in the updates' dtype (bfloat16 stays bfloat16)."""
    g = {"Dense_0": {"kernel": jnp.asarray(np.eye(4, 6), jnp.bfloat16)}}
    tx = so.scale_by_neuron_second_moment()
    out, _ = tx.update(g, tx.init(g))
    assert out["Dense_0"]["kernel"].dtype == jnp.bfloat16


# --------------------------------------------------------------------------
# The sharding helpers.
# --------------------------------------------------------------------------
def test_distribution_axes_skip_manual_axes():
    """Manual (shard_map) axes are not distribution axes; Auto / Explicit axes of size > 1 are."""
    manual = jax.sharding.AbstractMesh((2, 2), ("m", "a"), axis_types=(AxisType.Manual, AxisType.Auto))
    assert mesh_lib.distribution_axes(manual) == ("a",)


def test_keeping_layout_ties_traced_updates_to_the_gradients():
    """Under tracing, an update of the gradient's shape is tied to its layout with shard_alike."""
    text = str(jax.make_jaxpr(lambda a, b: mesh_lib.keeping_layout(a * 2, b))(jnp.ones(3), jnp.ones(3)))
    assert "shard_alike" in text


def test_blocks_local_shards_a_divisible_fan_in_axis():
    """A fused-QKV leaf is constrained over the devices on an axis they divide, and only on such an axis."""
    g = Geometry(shape=(4, 12), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
    text = str(jax.make_jaxpr(lambda x: mesh_lib.blocks_local(x, g, 2))(jnp.ones((4, 12))))
    assert "sharding_constraint" in text and "P('_devices', None)" in text
    odd = Geometry(shape=(3, 12), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
    text = str(jax.make_jaxpr(lambda x: mesh_lib.blocks_local(x, odd, 2))(jnp.ones((3, 12))))
    assert "sharding_constraint" not in text


def test_keeping_specs_on_an_explicit_mesh():
    """keeping_specs runs the function under auto_axes on an Explicit mesh; outputs keep the leaves' specs."""
    mesh = explicit_mesh()
    x = jax.device_put(f32(np.arange(24.0).reshape(4, 6)), NamedSharding(mesh, P("x")))
    (out,) = mesh_lib.keeping_specs(lambda a: (a * 2,), [x])
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(24.0).reshape(4, 6))
    assert jax.typeof(out).sharding.spec == P("x", None)


def test_axis_name_inside_shard_map_equals_the_unsharded_update():
    """With axis_name inside shard_map (one-device mesh) the update equals the unsharded one (float64)."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
    g = f32(np.arange(24.0).reshape(4, 6) - 11.5)
    tx = so.scale_by_spectral_norm(axis_name="x")
    body = lambda u: tx.update({"Dense_0": {"kernel": u}}, tx.init({"Dense_0": {"kernel": u}}))[0]["Dense_0"]["kernel"]
    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(g)
    g64 = np.asarray(g, np.float64)
    np.testing.assert_allclose(np.asarray(got), math.sqrt(6 / 4) * g64 / np.linalg.norm(g64), rtol=1e-5)
