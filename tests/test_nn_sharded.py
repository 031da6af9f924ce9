"""The package's NNX models on an Explicit mesh (``spectral_optax.nn.nnx``): a sharded embedding table and sharded
kernels are read, the output is the unsharded model's, laid out like the token ids, and the parameters keep their
shardings after the call."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

import spectral_optax as so


def _explicit_mesh():
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:1])


def test_nnx_model_reads_a_sharded_table_and_kernels_and_keeps_their_shardings():
    model = so.nn.nnx.ResidualMLP(3, 8, 1, 5, vocab_size=32, rngs=nnx.Rngs(0))
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (4, 3), 0, 32))
    with jax.default_matmul_precision("highest"):
        want = np.asarray(model(jnp.asarray(tokens)), np.float64)  # off the mesh
    sharded = {"embed": model.embed.embedding, "input_proj": model.input_proj.kernel, "head": model.head.kernel}
    with jax.set_mesh(_explicit_mesh()), jax.default_matmul_precision("highest"):
        for param in sharded.values():  # rows over data (the table's vocabulary, the head's fan-in)
            param.set_value(jax.device_put(param[...], P("data", None)))
        got = model(jax.device_put(jnp.asarray(tokens), P("data")))
        assert tuple(jax.typeof(got).sharding.spec)[0] == "data"  # the ids' layout: batch over data
        for name, param in sharded.items():
            assert tuple(jax.typeof(param[...]).sharding.spec) == ("data", None), name
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)
