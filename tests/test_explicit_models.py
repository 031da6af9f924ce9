"""The package's GPT (Linen and NNX) trains on a 2-D Explicit mesh (FSDP x TP, embedding sharded) as on one device.

A (4, 2) ``data`` x ``model`` mesh of host devices with ``AxisType.Explicit`` axes; kernels FSDP on
their fan-in and tensor-parallel on their fan-out, the branch-last ``attn/out`` and ``mlp/dense_1``
row-parallel (Megatron), the embedding tables sharded over rows and features, biases and norms over
``model``; token ids over ``data``. The one-device loss is checked against the float64 NumPy decoder
of ``tests/test_gpt.py``; the sharded loss and gradients equal the one-device ones (float32, 1e-6 and
1e-5), as do one Muon update from the same gradients and two Muon steps end to end (to Newton-Schulz's
conditioning of float32 rounding, 1e-3 and 2e-3), and the gradients and new parameters keep the
parameters' shardings.
"""

import os

import pytest

from tests.test_sharding import run_script

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import sys, warnings
sys.path.insert(0, TESTS)  # test_gpt's reference imports _nn_reference
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
from flax import nnx
import spectral_optax as so
import test_gpt as tg
from _nn_reference import randomize

warnings.filterwarnings("ignore", category=so.GeometryWarning)
assert jax.device_count() == 8, jax.devices()
V, D, H, K, T, B = 64, 32, 4, 2, 8, 8
tg.V, tg.D, tg.H, tg.K, tg.T = V, D, H, K, T  # the reference reads the sizes from its module
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
tokens = np.asarray(jax.random.randint(jax.random.key(5), (B, T + 1), 0, V))
x, y = tokens[:, :-1], tokens[:, 1:]


def spec(path, leaf, lead):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    pre = (None,) * (lead if name.startswith("blocks/") else 0)  # the scan's layer axis
    if name.endswith("embedding"):
        return P("data", "model")  # rows over data, features over model
    if name.endswith(("query/kernel", "key/kernel", "value/kernel")):
        return P(*pre, "data", "model", None)  # (D, heads, d_head): FSDP x heads
    if name.endswith("attn/out/kernel"):
        return P(*pre, "model", None, "data")  # (heads, d_head, D): row-parallel
    if name.endswith("mlp/dense_1/kernel"):
        return P(*pre, "model", "data")  # row-parallel
    if name.endswith("kernel"):
        return P(*pre, "data", "model")  # column-parallel (fan-out over model)
    if name.endswith(("query/bias", "key/bias", "value/bias")):
        return P(*pre, "model", None)
    return P(*pre, "model")  # other biases, norms


def xent(logits, labels):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def close(a, b, name, rtol, floor=1e-30):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(initial=0.0), floor), err_msg=name)


def check(kind, apply, params, lead, geometry):
    # the one-device loss against the float64 decoder: the model computes what it should
    logits = tg.reference_gpt(params, x, 2 / K, num_blocks=K)
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ref = -np.take_along_axis(logp, y[..., None], -1).mean()
    loss = lambda p, x, y: xent(apply(p, x), y)
    tx = so.muon(0.05, geometry=geometry)
    update = lambda g, p: tx.update(g, tx.init(p), p)[0]

    def train(p, x, y):  # two Muon steps
        s = tx.init(p)
        for _ in range(2):
            u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
            p = optax.apply_updates(p, u)
        return p

    l1, g1 = jax.jit(jax.value_and_grad(loss))(params, x, y)
    np.testing.assert_allclose(float(l1), ref, rtol=1e-5)
    u1, p1 = jax.jit(update)(g1, params), jax.jit(train)(params, x, y)
    specs = jax.tree_util.tree_map_with_path(lambda pth, a: spec(pth, a, lead), params)
    with jax.set_mesh(mesh):
        put = lambda t: jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), t, specs)
        ps = put(params)
        xs, ys = (jax.device_put(a, NamedSharding(mesh, P("data", None))) for a in (x, y))
        l8, g8 = jax.jit(jax.value_and_grad(loss))(ps, xs, ys)
        u8 = jax.jit(update)(put(g1), ps)  # the sharded optimizer on the one-device gradients
        p8 = jax.jit(train)(ps, xs, ys)
    np.testing.assert_allclose(float(l8), float(l1), rtol=1e-6)
    flat = jax.tree_util.tree_flatten_with_path(specs)[0]
    gmax = max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(g1))
    live_entries = [0, 0]
    for (path, sp), *leaves in zip(flat, *(jax.tree.leaves(t) for t in (g8, g1, u8, u1, p8, p1, params))):
        a, b, v, w, q, r, p0 = leaves
        name = kind + jax.tree_util.keystr(path)
        assert a.sharding.spec == v.sharding.spec == q.sharding.spec == sp, (name, a.sharding, q.sharding, sp)
        close(a, b, name + " grad", 1e-5, floor=1e-3 * gmax)
        # The key bias's gradient is zero in exact arithmetic (the softmax over keys is shift-invariant):
        # Adam's normalized step on those entries is rounding noise, left out.
        live = np.abs(np.asarray(b)) > 1e-6 * gmax
        live_entries[0] += live.sum()
        live_entries[1] += live.size
        # Newton-Schulz's five quintic steps amplify float32 rounding up to 3.4445 ** 5 ~ 490x along
        # small singular directions (these gradients' singular values span 1e-4): on one device a
        # 1e-7 relative perturbation of the gradient moves mlp/dense_0's update by 3e-4 of its largest
        # entry. Hence 1e-3 for one update and 2e-3 for two steps trained end to end.
        close(np.asarray(v)[live], np.asarray(w)[live], name + " update", 1e-3)
        step = lambda new: (np.asarray(new, np.float64) - np.asarray(p0, np.float64))[live]
        close(step(q), step(r), name + " two muon steps", 2e-3)
    assert live_entries[0] > 0.95 * live_entries[1], live_entries  # all but the key biases compared
    assert not np.allclose(np.asarray(p1["embed"]["embedding"]), np.asarray(params["embed"]["embedding"]))
    print("ok", kind, float(l8))


for qkv, scan in (("fused", True), ("split", False)):
    m = so.nn.linen.Transformer(V, D, K, num_heads=H, max_len=T, qkv=qkv, scan=scan)
    params = randomize(jax.jit(m.init)(jax.random.key(0), x)["params"], scale=0.2)
    geometry = so.GeometryMap.from_linen(m, x)
    check(f"linen {qkv} scan={scan}", lambda p, t: m.apply({"params": p}, t), params, int(scan), geometry)

# the NNX twin (same paths and function), params as a pure dict merged into its graph
nm = so.nn.nnx.Transformer(V, D, K, H, max_len=T, qkv="split", scan=True, rngs=nnx.Rngs(0))
graph, state = nnx.split(nm)
params = randomize(state.to_pure_dict(), scale=0.2)
check("nnx split scan=True", lambda p, t: nnx.merge(graph, p)(t), params, 1, so.as_geometry_map(nm))
"""


@pytest.mark.slow
def test_package_gpt_trains_on_an_explicit_fsdp_tp_mesh_as_on_one_device():
    out = run_script(f"TESTS = {TESTS!r}\n" + SCRIPT, devices=8)
    for kind in ("linen fused scan=True", "linen split scan=False", "nnx split scan=True"):
        assert f"ok {kind}" in out, out
