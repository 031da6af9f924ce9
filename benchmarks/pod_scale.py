"""Optimizer steps at pod scale, compiled only: flops, collective bytes and memory per device.

Nothing runs, so any pod size is simulated on one host: ``--devices N`` host
CPU devices, a mesh ``('data',)`` (or ``('data', 'model')`` with ``--tp K``),
every parameter a ``jax.ShapeDtypeStruct(shape, float32, sharding=...)``
with FSDP specs (the largest axis divisible by the ``data`` size; with
``--tp`` the other matrix axis over ``model``, Megatron style: fan-out for
q / k / v / gate / up / c_attn / c_fc, fan-in for o / down / c_proj), and
the step ``p -> apply_updates(p, tx.update(g, tx.init(p), p)[0])`` lowered and
compiled with ``jax.jit(step).lower(g, p).compile()``. Read from the compiled
program, per optimizer (``muon``, ``muon(distribute=False)``,
``optax.contrib.muon``, ``optax.adamw``, ``moga``):

* ``flops_ratio``: ``cost_analysis()['flops']`` (per device) over the same
  step compiled on one device, divided by ``N``;
* ``bytes_ratio``: operand bytes of every collective in ``as_text()`` over the
  device's float32 parameter shard;
* ``temp_gib``: ``memory_analysis().temp_size_in_bytes`` (and its ratio to the shard
  and to the largest single matrix of the tree in float32);
* ``compile_s``: lower + compile wall time (CPU-bound; machine-dependent);
* ``step_share``: the optimizer's per-device flops over the forward-backward's,
  ``6 x params x tokens / N`` at ``--tokens`` tokens per step.

Trees: ``gpt2xl`` (d 1600, 48 blocks, fused ``c_attn`` (d, 3d), tied
embedding), ``llama1b`` (d 2048, 16 blocks, q / k / v / o, SwiGLU 8192, vocab
32000, untied head), ``llama7b`` (d 4096, 32 blocks, SwiGLU 11008, vocab
32000, untied head), ``qwen05b`` (Qwen2.5-0.5B's shapes: d 896 = 7 x 128, 24 blocks, GQA
k / v of width 128, SwiGLU 4864, vocab 151936, tied head: sizes that few mesh axes divide), ``olmoe``
(OLMoE-1B-7B's shapes: d 2048, 16 blocks, 64 experts of SwiGLU 1024 stacked ``(64, d, 1024)`` per block,
a router, vocab 50304, untied head; with ``--scan`` the expert stacks are 4-D ``(16, 64, d, 1024)``).
``--layout tiles`` (with ``--tp``): every kernel ``P('data', 'model')`` on its (fan-in, fan-out)
instead of Megatron's column / row parallel split. ``--scan``: every block parameter stacked on a leading
layer axis (``nn.scan`` layout), its geometry given as an override.

``--ns-dtype bfloat16``: muon's iteration in bfloat16, the default on GPU / TPU (a pod), compiled
on CPU (its one-device reference too); matrices then move and Gram matrices sum in bfloat16. The
CPU backend promotes every bfloat16 collective to float32 (its ``all-reduce-promotion`` and
``float-normalization-bf16`` passes), so ``bytes_ratio`` counts them at 4 bytes; ``program_bytes``
(``program_bytes_ratio``) reads the same step's collectives in the program XLA dumps after
partitioning, before those passes (``--xla_dump_to``, pass ``all_to_all_decomposer``): what a GPU
or TPU moves.

``python -m benchmarks.pod_scale --devices N --tree gpt2xl|llama1b|llama7b|qwen05b|olmoe [--scan] [--tp K]
[--layout tiles] [--mesh explicit|auto] [--optimizers a,b] [--plan] [--ns-dtype bfloat16] --json PATH``
"""

from __future__ import annotations

import argparse
import atexit
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import time

from benchmarks import _devices

_devices.early_flags()  # --devices N: before JAX starts

#: where the programs are dumped before the CPU backend promotes bfloat16 collectives to float32
#: (its passes ``all-reduce-promotion`` and ``float-normalization-bf16``; a GPU / TPU keeps them
#: bfloat16): with ``--ns-dtype bfloat16`` the collective bytes are also read there
_DUMP = None
if __name__ == "__main__" and any(a in ("--ns-dtype=bfloat16", "bfloat16") for a in sys.argv[1:]):
    _DUMP = tempfile.mkdtemp(prefix="pod_scale_hlo_")
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={_DUMP} --xla_dump_hlo_pass_re=all_to_all_decomposer"
    ).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402

import spectral_optax as so  # noqa: E402
from spectral_optax.lab import pod  # noqa: E402
from spectral_optax.lab.cli import collective_bytes, write_json  # noqa: E402

#: each optimizer from ``(geometry overrides, ns_dtype)``; ``ns_dtype`` (``--ns-dtype``) is muon's
#: ``compute_dtype`` (``None``: the backend default, float32 on CPU; ``bfloat16`` is the GPU / TPU one)
#: The plan's flops per collective byte for the modelled pod (H100s over NVLink; the figure every documented
#: row was measured with). On host CPU devices muon's default would be the CPU row of the table
#: (spectral_optax/_distributed/plan.py), a different plan.
POD_FLOPS_PER_BYTE = 2000.0
OPTIMIZERS = {
    "muon": lambda geometry, dtype, fpb: so.muon(0.02, geometry=geometry, compute_dtype=dtype, flops_per_byte=fpb),
    "muon(distribute=False)": lambda geometry, dtype, fpb: so.muon(
        0.02, geometry=geometry, compute_dtype=dtype, distribute=False
    ),
    "optax.contrib.muon": lambda geometry, dtype, fpb: optax.contrib.muon(0.02),
    "optax.adamw": lambda geometry, dtype, fpb: optax.adamw(1e-3),
    "moga": lambda geometry, dtype, fpb: so.moga(0.01, geometry=geometry),
}


def _costs(compiled):
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    mem = compiled.memory_analysis()
    return (float((cost or {}).get("flops", 0.0)), int(sum(collective_bytes(compiled.as_text()).values())),
            int(getattr(mem, "temp_size_in_bytes", 0)))  # fmt: skip


def compile_step(tx, params):
    """Lower and compile the step; ``(flops, collective bytes, temp bytes, seconds)``."""

    def step(g, p):
        updates, _ = tx.update(g, tx.init(p), p)
        return optax.apply_updates(p, updates)

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(params, params).compile()
    seconds = time.perf_counter() - t0
    return (*_costs(compiled), seconds)


def program_bytes() -> int | None:
    """Collective operand bytes of the last compiled step as partitioned, before the CPU backend
    promotes bfloat16 collectives to float32 (the dump of :data:`_DUMP`); ``None`` without one."""
    if _DUMP is None:
        return None
    files = sorted(glob.glob(os.path.join(_DUMP, "*jit_step*after_all_to_all_decomposer*.txt")), key=os.path.getmtime)
    if not files:
        return None
    with open(files[-1]) as f:
        text = f.read()
    for name in glob.glob(os.path.join(_DUMP, "*")):  # keep the disk clean between optimizers
        if os.path.isfile(name):
            os.remove(name)
    return int(sum(collective_bytes(text).values()))


def measure(tree: str, n: int, mesh_kind: str = "explicit", tp: int = 1, scan: bool = False,
            optimizers=None, tokens: int = 2**20, plan: bool = False, ns_dtype=None,
            layout: str = "megatron", seed: int = 0, replicas: int = 1,
            flops_per_byte: float | None = POD_FLOPS_PER_BYTE) -> list[dict]:  # fmt: skip
    shapes, geometry = pod.tree_shapes(tree, scan)
    is_shape = lambda s: isinstance(s, tuple)
    mode = AxisType.Explicit if mesh_kind == "explicit" else AxisType.Auto
    if n % (tp * replicas):
        raise SystemExit(f"--tp {tp} x --replicas {replicas} must divide --devices {n}")
    data = n // (tp * replicas)
    axis_shape, names = ((data, tp), ("data", "model")) if tp > 1 else ((data,), ("data",))
    if replicas > 1:  # parameters replicated over 'replica' (multi-slice training): no spec names it
        axis_shape, names = (replicas, *axis_shape), ("replica", *names)
    mesh = jax.make_mesh(axis_shape, names, axis_types=(mode,) * len(names), devices=jax.devices()[:n])
    specs = pod.partition_specs(shapes, data, tp, layout, seed)
    sharded = jax.tree.map(lambda s, sp: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, sp)),
                           shapes, specs, is_leaf=is_shape)  # fmt: skip
    plain = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes, is_leaf=is_shape)
    sizes = dict(zip(names, axis_shape))
    shard_bytes = sum(
        4 * math.prod(s) / math.prod(sizes[a] for e in sp for a in ((e,) if isinstance(e, str) else (e or ())))
        for s, sp in zip(jax.tree.leaves(shapes, is_leaf=is_shape), jax.tree.leaves(specs))
    )
    num_params = sum(math.prod(s) for s in jax.tree.leaves(shapes, is_leaf=is_shape))
    largest = 4 * max(
        math.prod(g.shape) // g.num_slices for _, g in so.as_geometry_map(geometry).leaves(plain) if g.kind == "matrix"
    )
    fwd_bwd = 6 * num_params * tokens / n
    if plan:
        print(so.expert.orthogonalization_plan(sharded, geometry=geometry, kinds=("matrix",), ns_coefficients="auto",
                                        compute_dtype=ns_dtype, flops_per_byte=flops_per_byte))  # fmt: skip
    rows = []
    for name, make in OPTIMIZERS.items():
        if optimizers and name not in optimizers:
            continue
        tx = make(geometry, ns_dtype, flops_per_byte)
        row: dict = {"tree": tree, "scan": scan, "devices": n, "tp": tp, "replicas": replicas, "layout": layout,
                     "seed": seed if layout == "random" else None, "mesh": mesh_kind, "flops_per_byte": flops_per_byte,
                     "optimizer": name,
                     "ns_dtype": None if ns_dtype is None else jnp.dtype(ns_dtype).name,
                     "params": num_params, "shard_bytes": shard_bytes, "largest_matrix_bytes": largest}  # fmt: skip
        try:
            ref_flops, _, _, ref_s = compile_step(tx, plain)
            with jax.set_mesh(mesh):
                flops, comm, temp, seconds = compile_step(tx, sharded)
            program = program_bytes()
        except Exception as e:  # noqa: BLE001  (a layout an optimizer does not compile on)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        row.update({
            "flops_per_device": flops, "one_device_flops": ref_flops,
            "flops_ratio": flops / (ref_flops / n) if ref_flops else None,
            "collective_bytes": comm, "bytes_ratio": comm / shard_bytes,
            "program_bytes": program, "program_bytes_ratio": None if program is None else program / shard_bytes,
            "temp_bytes": temp, "temp_gib": temp / 2**30, "temp_over_shard": temp / shard_bytes,
            "temp_over_largest": temp / largest, "compile_s": seconds, "one_device_compile_s": ref_s,
            "tokens": tokens, "step_share": flops / fwd_bwd,
        })  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, required=True, help="N host CPU devices (set before JAX starts)")
    ap.add_argument("--tree", choices=sorted(pod.TREES), default="llama1b")
    ap.add_argument("--scan", action="store_true", help="stacked (nn.scan) block parameters, layer axis first")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size: a ('data', 'model') = (N/K, K) mesh")
    ap.add_argument("--layout", choices=("megatron", "tiles", "largest", "random"), default="megatron",
                    help="megatron: FSDP on the largest divisible axis (with --tp: Megatron's column / row split); "
                    "tiles: every kernel P('data', 'model'); largest: every leaf on its largest divisible axis "
                    "(with --tp: 'model' on the larger other matrix axis); random: drawn per leaf (--seed)")
    ap.add_argument("--seed", type=int, default=0, help="the --layout random draw")
    ap.add_argument("--replicas", type=int, default=1,
                    help="a leading 'replica' mesh axis of this size, parameters replicated over it (3-D with --tp)")
    ap.add_argument("--flops-per-byte", default=str(POD_FLOPS_PER_BYTE),
                    help="muon's flops_per_byte (default: an H100 pod's 2000); 'device': muon's default, the "
                    "figure of the device kind the plan is made on (a CPU's 296 on host devices)")
    ap.add_argument("--mesh", choices=("explicit", "auto"), default="explicit")
    ap.add_argument("--optimizers", default=None, help=f"comma-separated subset of {list(OPTIMIZERS)}")
    ap.add_argument("--tokens", type=int, default=2**20, help="tokens per step for the step share (default 1M)")
    ap.add_argument("--plan", action="store_true", help="print so.expert.orthogonalization_plan first")
    ap.add_argument("--ns-dtype", default=None, choices=("float32", "bfloat16"),
                    help="muon's iteration dtype (default: the backend's, float32 on CPU; GPU / TPU: bfloat16)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    if jax.device_count() < args.devices:
        raise SystemExit(f"--devices {args.devices}: only {jax.device_count()} devices (set it before JAX starts)")
    opts = args.optimizers.split(",") if args.optimizers else None
    if _DUMP is not None:
        atexit.register(shutil.rmtree, _DUMP, True)
    rows = measure(args.tree, args.devices, args.mesh, args.tp, args.scan, opts, args.tokens, args.plan,
                   None if args.ns_dtype is None else jnp.dtype(args.ns_dtype), args.layout, args.seed, args.replicas,
                   None if args.flops_per_byte == "device" else float(args.flops_per_byte))  # fmt: skip
    if args.json:
        meta = {"jax": jax.__version__, "backend": jax.default_backend(), "argv": argv,
                "date": time.strftime("%Y-%m-%d", time.gmtime())}  # fmt: skip
        write_json(args.json, {"meta": meta, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
