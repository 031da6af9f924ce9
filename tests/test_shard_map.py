"""Inside ``shard_map``: ``axis_name`` makes norms and Newton-Schulz reduce across shards.

References are float64 NumPy (the quintic iteration and the norms written
out here); the sharded results must equal them, and leaving ``axis_name``
out must give the documented local-only (per-block) answer, not the whole one.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spectral_optax as so
from tests.test_sharding import run_script

SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
import spectral_optax as so

mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
rng = np.random.default_rng(0)
G = rng.standard_normal((2, 16, 48)).astype(np.float32)


def ns_reference(g):  # float64, Frobenius-normalized, Muon's quintic, 5 steps
    x = g.astype(np.float64)
    x = x / np.linalg.norm(x, axis=(1, 2), keepdims=True)
    a, b, c = so.expert.MUON_QUINTIC
    for _ in range(5):
        A = x @ np.swapaxes(x, 1, 2)
        x = a * x + (b * A + c * A @ A) @ x
    return x


def smap(f, spec):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec))

ref = ns_reference(G)
for dim, spec in ((-1, P(None, None, "x")), (-2, P(None, "x", None))):
    got = smap(lambda g: so.newton_schulz(g, axis_name="x", sharded_axis=dim, method="standard"), spec)(G)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-4, atol=2e-5)
    local = smap(lambda g: so.newton_schulz(g, method="standard"), spec)(G)  # local-only: per block
    assert np.max(np.abs(np.asarray(local) - ref)) > 1e-2
print("ok newton_schulz")

# Norms with psum: l2 along the split axis (the Frobenius normalization's reduction), RMS along the split fan-out.
g64 = G.astype(np.float64)
for axis, spec in ((2, P(None, None, "x")), (1, P(None, "x", None))):
    l2 = smap(lambda g: so.expert.lp_dual_direction(g, 2.0, axis, axis_name="x"), spec)(G)
    np.testing.assert_allclose(np.asarray(l2), g64 / np.linalg.norm(g64, axis=axis, keepdims=True),
                               rtol=1e-5, atol=1e-7)
rms_spec = {"Dense_0": {"kernel": P(None, "x")}}
tx_rms = so.scale_by_fan_out_rms(axis_name=rms_spec)
rms = jax.jit(jax.shard_map(lambda g: tx_rms.update(g, tx_rms.init(g))[0], mesh=mesh, in_specs=(rms_spec,),
                            out_specs=rms_spec))({"Dense_0": {"kernel": G[0]}})["Dense_0"]["kernel"]
np.testing.assert_allclose(np.asarray(rms), g64[0] / np.sqrt(np.mean(g64[0] ** 2, -1, keepdims=True)),
                           rtol=1e-5, atol=1e-6)
row = smap(lambda g: so.expert.row_normalize(g, 3.0, axis_name="x"), P(None, "x", None))(G)
row_ref = np.sign(g64) * np.abs(g64) ** 2 / np.sum(np.abs(g64) ** 3, axis=1, keepdims=True) ** (2 / 3) * 16 ** (-1 / 3)
np.testing.assert_allclose(np.asarray(row), row_ref, rtol=1e-4, atol=1e-6)
row2 = smap(lambda g: so.expert.row_normalize(g, 2.0, axis_name="x"), P(None, "x", None))(G)  # p = 2: no powers
np.testing.assert_allclose(np.asarray(row2), g64 / np.linalg.norm(g64, axis=1, keepdims=True) / 4.0,
                           rtol=1e-5, atol=1e-7)
col = smap(lambda g: so.expert.column_normalize(g, 3.0, axis_name="x"), P(None, None, "x"))(G)  # q* = 3/2
col_ref = (np.sign(g64) * np.abs(g64) ** 0.5 / np.sum(np.abs(g64) ** 1.5, axis=2, keepdims=True) ** (1 / 3)
           * 48 ** (1 / 3) / 16)
np.testing.assert_allclose(np.asarray(col), col_ref, rtol=1e-4, atol=1e-6)
print("ok norms")

# Transforms and named optimizers with the parameters' in_specs as axis_name: equal to unsharded.
params = {"Dense_0": {"kernel": jnp.asarray(rng.standard_normal((16, 48)), jnp.float32),
                      "bias": jnp.asarray(rng.standard_normal((48,)), jnp.float32)},
          "Dense_1": {"kernel": jnp.asarray(rng.standard_normal((48, 16)), jnp.float32)}}
grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
specs = {"Dense_0": {"kernel": P(None, "x"), "bias": P("x")}, "Dense_1": {"kernel": P("x", None)}}
for name, make in {
    "muon": lambda a: so.muon(0.02, axis_name=a, output="muon", vector="normalize"),
    "moga": lambda a: so.moga(0.01, p=3.0, axis_name=a),
    "moga(col)": lambda a: so.moga(0.01, p=3.0, variant="col", axis_name=a),
    "orthogonalize": lambda a: so.orthogonalize_via_newton_schulz(axis_name=a),
    "scale_by_column_norm": lambda a: so.scale_by_column_norm(3.0, axis_name=a),
    "scale_by_spectral_norm": lambda a: so.scale_by_spectral_norm(axis_name=a),
}.items():
    tx_ref, tx = make(None), make(specs)
    want, _ = tx_ref.update(grads, tx_ref.init(params), params)

    def body(g, p):
        u, _ = tx.update(g, tx.init(p), p)
        return u

    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, specs), out_specs=specs))(grads, params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b))))
    print("ok", name)
# A mesh axis name is shorthand for P(name) on every leaf (FSDP along the first axis).
tx = so.orthogonalize_via_newton_schulz(axis_name="x")
want, _ = so.orthogonalize_via_newton_schulz().update(grads["Dense_1"], None)
got = jax.jit(jax.shard_map(lambda g: tx.update(g, None)[0], mesh=mesh, in_specs=P("x"), out_specs=P("x")))(
    grads["Dense_1"])
np.testing.assert_allclose(np.asarray(got["kernel"]), np.asarray(want["kernel"]), rtol=1e-5, atol=1e-6)
print("ok name")
"""


def test_shard_map_axis_name_equals_unsharded():
    out = run_script(SCRIPT, devices=4)
    for name in ("newton_schulz", "norms", "muon", "moga", "moga(col)", "orthogonalize", "scale_by_column_norm", "name"):
        assert f"ok {name}" in out, out


def f32(a):
    return jnp.asarray(a, jnp.float32)


@pytest.mark.usefixtures("highest_precision")
def test_axis_name_inside_shard_map_equals_the_unsharded_update():
    """With axis_name inside shard_map (one-device mesh) the update equals the unsharded one (float64)."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
    g = f32(np.arange(24.0).reshape(4, 6) - 11.5)
    tx = so.scale_by_spectral_norm(axis_name="x")
    body = lambda u: tx.update({"Dense_0": {"kernel": u}}, tx.init({"Dense_0": {"kernel": u}}))[0]["Dense_0"]["kernel"]
    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(g)
    g64 = np.asarray(g, np.float64)
    np.testing.assert_allclose(np.asarray(got), math.sqrt(6 / 4) * g64 / np.linalg.norm(g64), rtol=1e-5)
