"""Muon on layouts drawn at random, none chosen by us (issue 47; docs/sharding.md, "Any layout").

Every draw is ``benchmarks.pod_scale``'s ``--layout random --seed S``: per leaf, the FSDP axis
('data') drawn among the leaf's axes the mesh divides or none (replicated), and on meshes with a
'model' axis, that axis on the fan-in, the fan-out or neither; a 'replica' axis (3-D meshes) is never
named, so parameters are replicated over it (multi-slice training). Trees with stacked layers
(``nn.scan``), expert stacks and a fused QKV (``fan_out_splits=3``), Explicit and Auto meshes.

* Small shapes on 8 host devices, run: the sharded step equals the same step on one device
  (values; on Explicit meshes every update keeps its parameter's layout).
* Pod-sized trees at 64 / 256 host devices, compiled only (abstract ``ShapeDtypeStruct`` inputs,
  muon's default ``flops_per_byte``, what a user's step gets): per-device flops <= 1.3x / 2x the
  one-device step's over ``N`` (times the replica count on 3-D meshes: replicas repeat the work),
  collective operand bytes <= 3x / 6x the device's parameter shard, and temp memory <= 2x the
  tree's largest float32 matrix plus 2x the shard (the temp bound: a replicated leaf is whole on every
  device, and so are its momentum and update).

A failing draw prints its seed, layout and the ``benchmarks.pod_scale`` command that reproduces it.
"""

import json

import pytest

from tests.test_sharding import CLOSE, run_script

# One draw on 8 devices: (seed, tree, scan, mesh shape (replica, data, model), axis type).
RUN_DRAWS = [
    (1, "tiny_gpt2", True, (1, 4, 2), "auto"),
    (2, "tiny_moe", True, (2, 2, 2), "explicit"),
]
RUN_DRAWS_SLOW = [
    (0, "tiny_llama", False, (1, 8, 1), "explicit"),
    (3, "tiny_gpt2", False, (2, 4, 1), "explicit"),
] + [
    (seed, tree, scan, mesh, kind)
    for seed, (tree, scan) in enumerate(
        [("tiny_llama", True), ("tiny_moe", False), ("tiny_gpt2", True), ("tiny_llama", False)] * 3, start=10
    )
    for mesh, kind in [[((1, 8, 1), "auto"), ((1, 2, 4), "explicit"), ((2, 2, 2), "auto")][seed % 3]]
]

RUN = """
import sys, json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so
from spectral_optax.lab.pod import tree_shapes, partition_specs

draws = json.loads(sys.argv[1])
for seed, tree, scan, (r, d, t), kind in draws:
    shapes, geometry = tree_shapes(tree, scan)
    is_shape = lambda s: isinstance(s, tuple)
    specs = partition_specs(shapes, d, t, "random", seed)
    names = ("replica", "data", "model")
    mode = AxisType.Explicit if kind == "explicit" else AxisType.Auto
    mesh = jax.make_mesh((r, d, t), names, axis_types=(mode,) * 3)
    keys = iter(jax.random.split(jax.random.key(seed), 2 * len(jax.tree.leaves(shapes, is_leaf=is_shape))))
    params = jax.tree.map(lambda s: jax.random.normal(next(keys), s), shapes, is_leaf=is_shape)
    grads = jax.tree.map(lambda s: jax.random.normal(next(keys), s), shapes, is_leaf=is_shape)
    tx = so.muon(0.02, geometry=geometry)
    step = lambda g, p: tx.update(g, tx.init(p), p)[0]
    want = jax.jit(step)(grads, params)
    put = lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp))
    what = f"seed={seed} tree={tree} scan={scan} mesh={(r, d, t)} {kind} layout={specs}"
    print(what, flush=True)
    with jax.set_mesh(mesh):
        g, p = jax.tree.map(put, grads, specs), jax.tree.map(put, params, specs)
        got = jax.jit(step)(g, p)
        plan = so.expert.orthogonalization_plan(g, geometry=geometry)
    # within each replica group on Explicit meshes (the replica axis leads and no spec names it)
    assert plan.devices == (d * t if kind == "explicit" else r * d * t), (plan.devices, what)
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    for (path, a), b, sp in zip(flat_got, jax.tree.leaves(want), jax.tree.leaves(specs)):
        name = jax.tree_util.keystr(path) + " " + what
        close(a, b, name)
        if kind == "explicit":
            assert a.sharding.is_equivalent_to(NamedSharding(mesh, sp), a.ndim), (name, a.sharding, sp)
print("ok")
"""


def _run(draws):
    out = run_script(CLOSE + RUN, devices=8, args=[json.dumps(draws)])
    assert out.strip().endswith("ok"), out


def test_random_layouts_equal_the_one_device_update():
    """Two draws (2-D Auto with a fused QKV stack, 3-D Explicit with expert stacks): the sharded step
    equals one device's and keeps every layout; the slow tier runs 14 more."""
    _run(RUN_DRAWS)


@pytest.mark.slow
def test_random_layouts_equal_the_one_device_update_more_draws():
    _run(RUN_DRAWS_SLOW)


# Compile-only draws at pod scale: (devices, tree, scan, replicas, tp, mesh, seed) -> targets by N.
TARGETS = {64: (1.3, 3.0), 256: (2.0, 6.0)}
COMPILE = """
import sys, json
from benchmarks import pod_scale

n, tree, scan, replicas, tp, mesh, seed = json.loads(sys.argv[1])
argv = ["--devices", str(n), "--tree", tree, "--tp", str(tp), "--replicas", str(replicas), "--mesh", mesh,
        "--layout", "random", "--seed", str(seed), "--flops-per-byte", "device", "--optimizers", "muon"]
(row,) = pod_scale.main(argv + (["--scan"] if scan else []))
print(json.dumps(row))
"""


def _compile_draw(n, tree, scan, replicas, tp, mesh, seed):
    cmd = (
        f"python -m benchmarks.pod_scale --devices {n} --tree {tree}{' --scan' if scan else ''} --tp {tp} "
        f"--replicas {replicas} --mesh {mesh} --layout random --seed {seed} --flops-per-byte device "
        "--optimizers muon"
    )
    args = [json.dumps([n, tree, scan, replicas, tp, mesh, seed])]
    out = run_script(COMPILE, devices=n, timeout=1800, args=args)  # mixed layouts compile slowly (minutes)
    row = json.loads(out.strip().splitlines()[-1])
    assert "error" not in row, (cmd, row)
    flops_max, bytes_max = TARGETS[n]
    flops, comm = row["flops_ratio"] / replicas, row["bytes_ratio"]
    temp, bound = row["temp_bytes"], 2 * row["largest_matrix_bytes"] + 2 * row["shard_bytes"]
    print(cmd, f"flops {flops:.2f}x bytes {comm:.2f}x temp {temp / 2**30:.2f} GiB")
    assert flops <= flops_max and comm <= bytes_max and temp <= bound, (cmd, flops, comm, temp, bound)


COMPILE_DRAWS_SLOW = [
    (64, "gpt2xl", True, 1, 1, "explicit", 0),
    (64, "llama1b", False, 1, 1, "explicit", 1),  # 1.35x until 2026-12-07 (lab log (9a), (9c))
    (64, "llama1b", False, 1, 8, "auto", 2),
    pytest.param(
        (64, "olmoe", True, 2, 4, "explicit", 3),
        marks=pytest.mark.xfail(
            strict=True,
            reason="collectives 3.08x the shard against the 3x target since all-gathers count what a device "
            "receives (2026-12-07; 29.1 of the 31.5 GB per device are all-gathers, most of them sharding "
            "constraints gathering whole (16, 2048, 2048) layer stacks; flops 1.01x, temp 16.8 GiB hold): open, "
            "issue 47",
        ),
    ),
    (256, "llama1b", False, 1, 1, "explicit", 4),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "draw", COMPILE_DRAWS_SLOW, ids=lambda d: "-".join(map(str, d)) if isinstance(d, tuple) else None
)
def test_random_layouts_at_pod_scale_hold_the_targets(draw):
    _compile_draw(*draw)
