"""The mesh / layout helpers (``spectral_optax._mesh.layout``): which axes distribute, which layouts updates keep."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spectral_optax import Geometry
from spectral_optax._mesh import layout as mesh_lib


def f32(a):
    return jnp.asarray(a, jnp.float32)


def explicit_mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))


@pytest.mark.usefixtures("highest_precision")
def test_distribution_axes_skip_manual_axes():
    """Manual (shard_map) axes are not distribution axes; Auto / Explicit axes of size > 1 are."""
    manual = jax.sharding.AbstractMesh((2, 2), ("m", "a"), axis_types=(AxisType.Manual, AxisType.Auto))
    assert mesh_lib.distribution_axes(manual) == ("a",)


@pytest.mark.usefixtures("highest_precision")
def test_keeping_layout_ties_traced_updates_to_the_gradients():
    """Under tracing, an update of the gradient's shape is tied to its layout with shard_alike."""
    text = str(jax.make_jaxpr(lambda a, b: mesh_lib.keeping_layout(a * 2, b))(jnp.ones(3), jnp.ones(3)))
    assert "shard_alike" in text


@pytest.mark.usefixtures("highest_precision")
def test_blocks_local_shards_a_divisible_fan_in_axis():
    """A fused-QKV leaf is constrained over the devices on an axis they divide, and only on such an axis."""
    g = Geometry(shape=(4, 12), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
    text = str(jax.make_jaxpr(lambda x: mesh_lib.blocks_local(x, g, 2))(jnp.ones((4, 12))))
    assert "sharding_constraint" in text
    odd = Geometry(shape=(3, 12), fan_in_axes=(0,), fan_out_axes=(1,), fan_out_splits=3)
    text = str(jax.make_jaxpr(lambda x: mesh_lib.blocks_local(x, odd, 2))(jnp.ones((3, 12))))
    assert "sharding_constraint" not in text


@pytest.mark.usefixtures("highest_precision")
def test_keeping_specs_on_an_explicit_mesh():
    """keeping_specs runs the function under auto_axes on an Explicit mesh; outputs keep the leaves' specs."""
    mesh = explicit_mesh()
    x = jax.device_put(f32(np.arange(24.0).reshape(4, 6)), NamedSharding(mesh, P("x")))
    (out,) = mesh_lib.keeping_specs(lambda a: (a * 2,), [x])
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(24.0).reshape(4, 6))
    assert jax.typeof(out).sharding.spec == P("x", None)
