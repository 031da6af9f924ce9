"""The mesh helpers of the package's models (``spectral_optax.nn``): row gathers and parameter reads on meshes."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from spectral_optax.nn._sharded import gathered_call, rows_sharding


def _explicit_mesh():
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:1])


def test_rows_sharding_appends_a_replicated_feature_axis():
    """On an Explicit mesh rows_sharding is ids' spec then None for the features."""
    mesh = _explicit_mesh()
    with jax.set_mesh(mesh):
        ids = jax.device_put(jnp.arange(4), P("data"))
        table = jax.device_put(jnp.ones((8, 3)), P("data", None))
        assert tuple(rows_sharding(table, ids)) == ("data", None)


def test_gathered_call_with_sharded_params_matches_numpy_and_restores():
    """gathered_call on an Explicit mesh with a sharded kernel gives x W + b and leaves the kernel sharded."""
    mesh = _explicit_mesh()
    lin = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    w, b = np.asarray(lin.kernel[...], np.float64), np.asarray(lin.bias[...], np.float64)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    with jax.set_mesh(mesh):
        lin.kernel.set_value(jax.device_put(lin.kernel[...], P("data", None)))
        y = gathered_call(lin, jnp.asarray(x))
        assert tuple(jax.typeof(lin.kernel[...]).sharding.spec) == ("data", None)
    np.testing.assert_allclose(np.asarray(y), x @ w + b, rtol=1e-5, atol=1e-6)
