"""Which mesh axes distribute the orthogonalization, and which layouts updates keep, seen through
the public optimizers (``so.expert.orthogonalization_plan``, ``so.muon``, ``so.scale_by_row_norm``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spectral_optax as so
from tests.test_sharding import CLOSE, run_script


def abstract_leaves(shape, names, types, n=2):
    mesh = jax.sharding.AbstractMesh(shape, names, axis_types=types)
    leaf = jax.ShapeDtypeStruct((16, 16), jnp.float32, sharding=NamedSharding(mesh, P()))
    return {f"l{i}": {"kernel": leaf} for i in range(n)}


@pytest.mark.parametrize(
    "types, devices",
    [
        ((AxisType.Manual, AxisType.Auto), 2),  # inside shard_map: the manual axis is not spread over
        ((AxisType.Auto, AxisType.Auto), 4),
        ((AxisType.Explicit, AxisType.Explicit), 4),
    ],
)
def test_plan_spreads_over_the_non_manual_axes(types, devices):
    """The plan's devices: the product of the mesh's non-``Manual`` axes (Auto / Explicit) in the leaves' types."""
    plan = so.expert.orthogonalization_plan(abstract_leaves((2, 2), ("m", "a"), types))
    assert plan.devices == devices, plan


def row_norm_reference(g):
    """``scale_by_row_norm()`` in float64: each fan-in vector (a column of an ``(in, out)`` kernel)
    l2-normalized, times ``d_in ** -0.5``."""
    g = np.asarray(g, np.float64)
    return g / np.linalg.norm(g, axis=0, keepdims=True) / np.sqrt(g.shape[0])


@pytest.mark.usefixtures("highest_precision")
def test_dual_map_keeps_the_specs_on_an_explicit_mesh():
    """On an Explicit mesh (one device) a dual map's updates are the float64 reference, each in its
    leaf's spec: a kernel sharded on its fan-in, and a fused QKV kernel sharded on its fused fan-out
    (its cut into blocks reshapes the sharded axis, which Explicit types refuse outside ``auto_axes``)."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(0)
    grads = {"dense": rng.normal(size=(4, 6)), "qkv": rng.normal(size=(4, 12))}
    specs = {"dense": P("x", None), "qkv": P(None, "x")}
    qkv = so.Geometry(shape=(4, 12), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
    tx = so.scale_by_row_norm(geometry={r"qkv/kernel$": qkv})
    with jax.set_mesh(mesh):
        xs = {
            k: {"kernel": jax.device_put(jnp.asarray(g, jnp.float32), NamedSharding(mesh, specs[k]))}
            for k, g in grads.items()
        }
        u, _ = jax.jit(tx.update)(xs, tx.init(xs))
    for k, g in grads.items():
        out = u[k]["kernel"]
        np.testing.assert_allclose(np.asarray(out, np.float64), row_norm_reference(g), rtol=1e-6, atol=1e-7, err_msg=k)
        assert jax.typeof(out).sharding.spec == specs[k], (k, jax.typeof(out).sharding)


# On 4 host devices (an Auto mesh): muon's updates equal the one-device step, a fused QKV leaf
# sharded on its fan-out keeps that layout (without the tie, XLA hands back the local cut's
# P('data', None)), and a dual map's traced update cuts the fused leaf over the devices on its
# fan-in (a constraint on a '_devices' view of them) only where they divide it.
AUTO_MESH = (
    CLOSE
    + """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so

mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
fused = lambda d_in: so.Geometry(shape=(d_in, 24), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
keys = jax.random.split(jax.random.key(0), 2)
grads = {"qkv": {"kernel": jax.random.normal(keys[0], (8, 24))}, "w": {"kernel": jax.random.normal(keys[1], (16, 64))}}
tx = so.muon(0.1, geometry={r"qkv/kernel$": fused(8)})
one, _ = jax.jit(tx.update)(grads, tx.init(grads), grads)
sharded = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, P(None, "data"))), grads)
got, _ = jax.jit(tx.update)(sharded, tx.init(sharded), sharded)
for name in grads:
    close(got[name]["kernel"], one[name]["kernel"], name)
    assert got[name]["kernel"].sharding.spec == P(None, "data"), (name, got[name]["kernel"].sharding)
row = lambda d_in: so.scale_by_row_norm(geometry={r"qkv/kernel$": fused(d_in)})
cut = lambda tx, g: "'_devices': 4" in str(jax.make_jaxpr(tx.update)(g, tx.init(g)))
assert cut(row(8), {"qkv": sharded["qkv"]}), "the fused leaf is not cut over the devices on its fan-in"
odd = {"qkv": {"kernel": jax.device_put(jnp.ones((6, 24)), NamedSharding(mesh, P(None, "data")))}}
assert not cut(row(6), odd), "6 rows do not divide over 4 devices"
print("ok")
"""
)


def test_updates_keep_the_gradients_layout_on_an_auto_mesh():
    assert "ok" in run_script(AUTO_MESH, devices=4)


# Same-shape leaves of mixed layouts on 4 host devices (an Auto mesh), the plan spreading their
# orthogonalizations over the devices (flops_per_byte=0): each update keeps its own gradient's
# layout and equals the one-device step. Every tie of an update to its gradient (shard_alike) must be
# its own sharding group: JAX lowers equal equations once, and the ties of one shape shared one group
# id, so every such leaf came back in one layout (P('data', None) here), mup_adamw's elementwise
# update included (its tie is the named optimizers' common keeping_layout). Called eagerly (no jit)
# on the sharded gradients, muon's update is the same (the plan's device views failed outside jit).
MIXED_LAYOUTS = (
    CLOSE
    + """
import jax, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so

mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
specs = {"a": P("data", None), "b": P(None, "data"), "c": P(), "d": P("data", None), "e": P(None, "data")}
keys = jax.random.split(jax.random.key(0), len(specs))
grads = {k: {"kernel": jax.random.normal(key, (16, 16))} for k, key in zip(specs, keys)}
sharded = {k: {"kernel": jax.device_put(grads[k]["kernel"], NamedSharding(mesh, specs[k]))} for k in specs}
muon = so.muon(0.1, flops_per_byte=0.0)
for name, tx, step in [("muon", muon, jax.jit(muon.update)), ("mup_adamw", so.mup_adamw(1e-3), None),
                       ("eager muon", muon, muon.update)]:  # eager: the plan runs under its own jit
    one, _ = jax.jit(tx.update)(grads, tx.init(grads), grads)
    got, _ = (step or jax.jit(tx.update))(sharded, tx.init(sharded), sharded)
    for k, spec in specs.items():
        close(got[k]["kernel"], one[k]["kernel"], f"{name} {k}")
        out, x = got[k]["kernel"].sharding, sharded[k]["kernel"].sharding
        # eagerly, trailing unsharded dimensions are dropped from the spec (P('data',)): the same layout
        assert out.spec == spec if step is not muon.update else out.is_equivalent_to(x, 2), (name, k, spec, out)
print("ok")
"""
)


def test_same_shape_leaves_keep_their_own_layouts_on_an_auto_mesh():
    assert "ok" in run_script(MIXED_LAYOUTS, devices=4)
