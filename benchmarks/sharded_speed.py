"""Sharded optimizer steps: per-device flops, bytes through collectives, step time.

For each optimizer (``spectral_optax.muon``, the same with
``distribute=False`` (XLA's partitioning of every matmul), ``optax.contrib.muon``,
``spectral_optax.moga``, ``optax.adamw``) and each device count ``N`` the
optimizer update is compiled under ``jit`` on a 1-D mesh of ``N`` devices
with FSDP parameter shardings (every matrix ``P('data', None)``) and read
back from the compiled program:

* ``flops``: XLA's cost analysis of the partitioned (per-device) program;
* ``collective_bytes``: the operand bytes of every collective op
  (all-gather, all-reduce, all-to-all, reduce-scatter, collective-permute)
  in the compiled HLO, i.e. what one device sends into collectives per step;
* ``step_ms``: wall time of the jitted update (median of ``--repeats``).

Trees: ``fsdp`` (8 hidden kernels 256 x 1024) and ``gpt2`` (GPT-2-small
shaped: 12 blocks of fused QKV 768 x 2304 declared as 3 blocks, attention
output 768 x 768, MLP 768 x 3072 and 3072 x 768, plus embeddings, LayerNorm
scales and biases; ``--quick`` uses 2 blocks). The orthogonalization
targets of docs/sharding.md are checked on the ``fsdp`` tree and on the
GPT-2 tree's hidden matrices.

``python -m benchmarks.sharded_speed [--devices N] [--multihost] [--json PATH] [--quick]``

Host CPU devices by default (``--devices N`` forces ``N`` of them: the flag
must come before JAX starts, so it is set here before importing JAX); with
real accelerators present, their devices are used as they are.
``--multihost`` calls ``jax.distributed.initialize()`` first (TPU pods, GPU
clusters: one process per host, each running this same command) and only
process 0 writes the JSON file.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import spectral_optax as so  # noqa: E402
from spectral_optax.lab.cli import compiled_costs, environment, write_json  # noqa: E402


# --------------------------------------------------------------------------
# Trees.
# --------------------------------------------------------------------------
def fsdp_tree():
    """8 hidden kernels 256 x 1024 (the issue's FSDP tree)."""
    return {f"layer{i}": {"Dense_0": {"kernel": (256, 1024)}} for i in range(8)}, {}


def gpt2_tree(blocks: int = 12, d: int = 768, vocab: int = 50304, ctx: int = 1024):
    """GPT-2-small shapes (fused QKV as 3 blocks through the geometry)."""
    tree = {"wte": {"embedding": (vocab, d)}, "wpe": {"embedding": (ctx, d)}, "ln_f": {"scale": (d,), "bias": (d,)}}
    for b in range(blocks):
        tree[f"h{b}"] = {
            "ln_1": {"scale": (d,), "bias": (d,)},
            "attn": {"qkv": {"kernel": (d, 3 * d), "bias": (3 * d,)}, "proj": {"kernel": (d, d), "bias": (d,)}},
            "ln_2": {"scale": (d,), "bias": (d,)},
            "mlp": {"fc": {"kernel": (d, 4 * d), "bias": (4 * d,)}, "proj": {"kernel": (4 * d, d), "bias": (d,)}},
        }
    geometry = {r"qkv/kernel$": {"kind": "matrix", "fan_out_splits": 3}}
    return tree, geometry


def fsdp_specs(shapes, n: int):
    """FSDP: the first axis sharded over 'data' when divisible, else the last, else replicated."""

    def spec(shape):
        if len(shape) >= 1 and shape[0] % n == 0:
            return P("data", *([None] * (len(shape) - 1)))
        if len(shape) >= 2 and shape[-1] % n == 0:
            return P(*([None] * (len(shape) - 1)), "data")
        return P()

    return jax.tree.map(spec, shapes, is_leaf=lambda s: isinstance(s, tuple))


def hidden_orthogonalized_flops(shapes, geometry) -> float:
    """Total Newton-Schulz flops of every hidden matrix (what the devices share)."""
    gmap = so.as_geometry_map(geometry)
    total = 0.0
    arrays = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes, is_leaf=lambda s: isinstance(s, tuple)
    )
    for _, g in gmap.leaves(arrays):
        if g.kind == "matrix" and g.role == "hidden":
            m, n = min(g.d_in, g.d_out), max(g.d_in, g.d_out)
            method = so.expert.newton_schulz_method(m, n, 5, jnp.float32)
            total += g.num_slices * so.expert.newton_schulz_flops(m, n, 5, method)
    return total


#: The plan's flops per collective byte of the documented rows (an H100-over-NVLink figure,
#: kept so the rows reproduce). On host CPU devices muon's default would be the CPU row of the table
#: (spectral_optax/_distributed/plan.py), a different plan.
POD_FLOPS_PER_BYTE = 2000.0
OPTIMIZERS = {
    "muon": lambda geometry: so.muon(0.02, geometry=geometry, flops_per_byte=POD_FLOPS_PER_BYTE),
    "muon(distribute=False)": lambda geometry: so.muon(0.02, geometry=geometry, distribute=False),
    "optax.contrib.muon": lambda geometry: optax.contrib.muon(0.02),
    "moga": lambda geometry: so.moga(0.01, geometry=geometry),
    "optax.adamw": lambda geometry: optax.adamw(1e-3),
}


def measure(tree_name: str, n: int, repeats: int, quick: bool, optimizers=None) -> list[dict]:
    shapes, geometry = fsdp_tree() if tree_name == "fsdp" else gpt2_tree(blocks=2 if quick else 12)
    devices = np.array(jax.devices()[:n])
    mesh = jax.sharding.Mesh(devices, ("data",))
    specs = fsdp_specs(shapes, n)
    spec_for = lambda shape: fsdp_specs({"x": shape}, n)["x"]
    is_shape = lambda s: isinstance(s, tuple)
    key = iter(jax.random.split(jax.random.key(0), 4096))

    def make(shape, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.jit(lambda k: jax.random.normal(k, shape) * 0.02, out_shardings=sharding)(next(key))

    params = jax.tree.map(make, shapes, specs, is_leaf=is_shape)
    grads = jax.tree.map(lambda p: p * 0.5 + 0.01, params)
    shard_bytes = sum(int(np.prod(s)) * 4 for s in jax.tree.leaves(shapes, is_leaf=is_shape)) / n
    ns_total = hidden_orthogonalized_flops(shapes, geometry)
    rows = []
    for name, make_tx in OPTIMIZERS.items():
        if optimizers and name not in optimizers:
            continue
        tx = make_tx(geometry)
        # Optimizer state in the parameters' shardings (on Auto meshes a jitted init returns fresh
        # zeros unsharded); the FSDP rule depends on the shape only, so it applies to state leaves too.
        state = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec_for(tuple(x.shape)))),
                             jax.jit(tx.init)(params))
        update = jax.jit(tx.update)
        try:
            flops, comm = compiled_costs(update, grads, state, params)
        except Exception as e:  # noqa: BLE001  (a third-party optimizer that does not compile here)
            rows.append({"tree": tree_name, "devices": n, "optimizer": name, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        times = []
        if repeats:
            jax.block_until_ready(update(grads, state, params))
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(update(grads, state, params))
            times.append(time.perf_counter() - t0)
        rows.append({
            "tree": tree_name, "devices": n, "optimizer": name, "flops_per_device": flops,
            "collective_bytes": comm, "param_shard_bytes": shard_bytes,
            "bytes_over_shard": comm / shard_bytes, "flops_over_ns_total_per_device": flops / (ns_total / n),
            "step_ms": 1e3 * float(np.median(times)) if times else None,
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _devices.add_arguments(ap)  # --devices: the largest N (N = 1, 2, 4, 8, ... up to it); --multihost
    ap.add_argument("--json", default=None, help="write the rows here (process 0 only)")
    ap.add_argument("--quick", action="store_true", help="2-block GPT-2 tree, 2 repeats")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps (0: compile and read costs only)")
    ap.add_argument("--trees", default="fsdp,gpt2")
    ap.add_argument("--counts", default=None, help="comma-separated device counts (default: 1, 2, 4, 8, ... up to N)")
    ap.add_argument("--optimizers", default=None, help=f"comma-separated subset of {list(OPTIMIZERS)}")
    args = ap.parse_args(argv)
    if args.multihost:
        jax.distributed.initialize()
    total = jax.device_count()
    top = min(args.devices or total, total)
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= top]
    if top not in counts:
        counts.append(top)
    if args.counts:
        counts = [int(c) for c in args.counts.split(",") if int(c) <= total]
    if args.multihost:  # every process must take part in every program: all devices only
        counts = [total]
    rows = []
    for tree in args.trees.split(","):
        for n in counts:
            reps = min(2, args.repeats) if args.quick else args.repeats
            rows += measure(tree, n, reps, args.quick, args.optimizers.split(",") if args.optimizers else None)
    if jax.process_index() == 0:
        meta = {**environment(), "device_count": total, "processes": jax.process_count(),
                "date": time.strftime("%Y-%m-%d", time.gmtime())}
        write_json(args.json, {"meta": meta, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
