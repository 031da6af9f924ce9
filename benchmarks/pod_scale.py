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
import random
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
from jax.sharding import PartitionSpec as P  # noqa: E402

import spectral_optax as so  # noqa: E402
from spectral_optax.lab.cli import collective_bytes, write_json  # noqa: E402

TREES = {  # d, blocks, MLP width, vocab, kind
    "gpt2xl": (1600, 48, 6400, 50304, "gpt2"),
    "llama1b": (2048, 16, 8192, 32000, "llama"),
    "llama7b": (4096, 32, 11008, 32000, "llama"),
    "qwen05b": (896, 24, 4864, 151936, "qwen"),  # GQA k / v of width 128, tied head, d = 7 x 128
    "olmoe": (2048, 16, 1024, 50304, "moe"),  # 64 experts of SwiGLU 1024 per block, untied head
    "gemma2": (3584, 42, 14336, 256000, "gemma"),  # Gemma-2-9B: q 16 x 256, GQA k / v 8 x 256, tied head
    "mixtral": (4096, 32, 14336, 32000, "mixtral"),  # Mixtral-8x7B: 8 experts, GQA k / v 1024, untied head
    "dsv2lite": (2048, 27, 1408, 102400, "mla"),  # DeepSeek-V2-Lite: MLA, 64 routed experts, 2 shared
    # small trees for the random-layout tests (tests/test_random_layouts.py), each kind's shapes scaled down
    "tiny_llama": (128, 2, 384, 512, "llama"),
    "tiny_gpt2": (64, 2, 256, 384, "gpt2"),
    "tiny_moe": (64, 2, 96, 256, "moe"),
}
#: experts per block of the ``moe`` trees (OLMoE-1B-7B's 64; the tiny tree's 8)
MOE_EXPERTS = 64
#: parameter names whose fan-out (else fan-in) is split over 'model' with --tp (Megatron layout)
COLUMN_PARALLEL = ("q", "k", "v", "gate", "up", "c_attn", "c_fc")

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


def tree_shapes(name: str, scan: bool = False):
    """``(shapes, geometry overrides)``: a nested dict of shape tuples, Flax-style names."""
    d, blocks, f, vocab, kind = TREES[name]
    if kind == "gpt2":
        block = {
            "ln_1": {"scale": (d,), "bias": (d,)}, "ln_2": {"scale": (d,), "bias": (d,)},
            "attn": {"c_attn": {"kernel": (d, 3 * d), "bias": (3 * d,)}, "c_proj": {"kernel": (d, d), "bias": (d,)}},
            "mlp": {"c_fc": {"kernel": (d, f), "bias": (f,)}, "c_proj": {"kernel": (f, d), "bias": (d,)}},
        }  # fmt: skip
        top = {"wte": {"embedding": (vocab, d)}, "wpe": {"embedding": (1024, d)}, "ln_f": {"scale": (d,), "bias": (d,)}}
    elif kind in ("moe", "mixtral"):  # every expert's SwiGLU as one (E, fan-in, fan-out) stack per block
        e = 8 if kind == "mixtral" or name.startswith("tiny") else MOE_EXPERTS
        kv = d // 4 if kind == "mixtral" else d  # Mixtral's GQA: 8 k / v heads of 128 against 32
        block = {
            "attn_norm": {"scale": (d,)}, "mlp_norm": {"scale": (d,)},
            "attn": {n: {"kernel": (d, kv if n in ("k", "v") else d)} for n in ("q", "k", "v", "o")},
            "moe": {"router": {"kernel": (d, e)}, "experts": {"gate": (e, d, f), "up": (e, d, f), "down": (e, f, d)}},
        }  # fmt: skip
        top = {"embed": {"embedding": (vocab, d)}, "norm": {"scale": (d,)}, "lm_head": {"kernel": (d, vocab)}}
    elif kind == "mla":  # DeepSeek-V2-Lite: MLA attention (16 heads, no q LoRA), 64 routed experts + 2 shared
        h, rope, nope, v, lora = 16, 64, 128, 128, 512
        attn = {"q_proj": {"kernel": (d, h * (nope + rope))}, "kv_a_proj_with_mqa": {"kernel": (d, lora + rope)},
                "kv_a_layernorm": {"scale": (lora,)}, "kv_b_proj": {"kernel": (lora, h * (nope + v))},
                "o_proj": {"kernel": (h * v, d)}}  # fmt: skip
        block = {
            "attn_norm": {"scale": (d,)}, "mlp_norm": {"scale": (d,)}, "attn": attn,
            "moe": {"router": {"kernel": (d, 64)},
                    "experts": {"gate": (64, d, f), "up": (64, d, f), "down": (64, f, d)},
                    "shared": {"gate": {"kernel": (d, 2 * f)}, "up": {"kernel": (d, 2 * f)},
                               "down": {"kernel": (2 * f, d)}}},
        }  # fmt: skip
        top = {"embed": {"embedding": (vocab, d)}, "norm": {"scale": (d,)}, "lm_head": {"kernel": (d, vocab)}}
        dense = {n: {"kernel": (d, 10944) if n != "down" else (10944, d)} for n in ("gate", "up", "down")}
        top["h0"] = {"attn_norm": {"scale": (d,)}, "mlp_norm": {"scale": (d,)}, "attn": attn, "mlp": dense}
    elif kind == "gemma":  # Gemma-2-9B: 16 query heads and 8 k / v heads of 256, GeGLU 14336, tied head, 4 norms
        q, kv = 16 * 256, 8 * 256
        block = {
            **{n: {"scale": (d,)} for n in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")},
            "attn": {"q": {"kernel": (d, q)}, "k": {"kernel": (d, kv)}, "v": {"kernel": (d, kv)},
                     "o": {"kernel": (q, d)}},
            "mlp": {"gate": {"kernel": (d, f)}, "up": {"kernel": (d, f)}, "down": {"kernel": (f, d)}},
        }  # fmt: skip
        top = {"embed": {"embedding": (vocab, d)}, "norm": {"scale": (d,)}}
    else:
        kv = 128 if kind == "qwen" else d  # GQA: k / v narrower than q
        block = {
            "attn_norm": {"scale": (d,)}, "mlp_norm": {"scale": (d,)},
            "attn": {n: {"kernel": (d, kv if n in ("k", "v") else d)} for n in ("q", "k", "v", "o")},
            "mlp": {"gate": {"kernel": (d, f)}, "up": {"kernel": (d, f)}, "down": {"kernel": (f, d)}},
        }  # fmt: skip
        top = {"embed": {"embedding": (vocab, d)}, "norm": {"scale": (d,)}}
        if kind != "qwen":  # qwen: the head is the tied embedding
            top["lm_head"] = {"kernel": (d, vocab)}
    is_shape = lambda s: isinstance(s, tuple)
    geometry: dict = {}
    matrix = {"kind": "matrix", "fan_in_axes": (-2,), "fan_out_axes": (-1,)}
    if kind in ("moe", "mixtral", "mla"):  # the expert axis (and, scanned, the layer axis) a batch axis
        geometry[r"/experts/(gate|up|down)$"] = matrix
    if scan:
        layers = blocks - 1 if kind == "mla" else blocks  # DeepSeek's first block is dense, unstacked
        top["blocks"] = jax.tree.map(lambda s: (layers, *s), block, is_leaf=is_shape)
        if kind == "gpt2":  # first: the first override that matches a path decides it
            geometry[r"^blocks/.*/c_attn/kernel$"] = {**matrix, "fan_out_splits": 3}
        geometry[r"^blocks/.*/kernel$"] = matrix
        geometry[r"^blocks/.*(scale|bias)$"] = {"kind": "vector", "fan_out_axes": (-1,)}
    else:
        top.update({f"h{i}": block for i in range(1 if kind == "mla" else 0, blocks)})
    return top, geometry


def partition_specs(shapes, data: int, tp: int, layout: str = "megatron", seed: int = 0):
    """One ``PartitionSpec`` per leaf on the mesh ``(['replica',] 'data'[, 'model'])``; 'replica' is
    never named (parameters replicated over it, the multi-slice layout).

    * ``'megatron'``: FSDP over 'data' on the largest divisible axis, and with ``tp > 1`` Megatron TP
      over 'model' (fan-out of :data:`COLUMN_PARALLEL` kernels and embeddings, else fan-in);
    * ``'tiles'`` (with ``tp > 1``): every kernel's fan-in (axis -2) over 'data' and fan-out (axis -1)
      over 'model', where they divide: the 2-D layout of a user who shards every matrix the same way;
    * ``'largest'``: each leaf FSDP-sharded on its largest axis that 'data' divides (ties: the first),
      the plain heuristic of many trainers; with ``tp > 1`` the largest other of its last two axes
      that 'model' divides over 'model';
    * ``'random'``: :func:`random_specs` with ``seed``.
    """
    if layout == "random":
        return random_specs(shapes, data, tp, seed)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda s: isinstance(s, tuple))
    specs = []
    for path, shape in flat:
        entries: list = [None] * len(shape)
        names = [getattr(k, "key", "") for k in path]
        if layout == "tiles" and tp > 1 and len(shape) >= 2:
            if shape[-1] % tp == 0:
                entries[-1] = "model"
            if shape[-2] % data == 0:
                entries[-2] = "data"
        elif layout == "largest":
            free = [a for a in range(len(shape)) if shape[a] % data == 0] if data > 1 else []
            if free:
                entries[max(free, key=lambda a: (shape[a], -a))] = "data"
            other = [a for a in range(max(len(shape) - 2, 0), len(shape)) if entries[a] is None and shape[a] % tp == 0]
            if tp > 1 and len(shape) >= 2 and other:
                entries[max(other, key=lambda a: (shape[a], -a))] = "model"
            specs.append(P(*entries))
            continue
        elif tp > 1 and len(shape) >= 2:
            axis = len(shape) - 1 if {names[-2], names[-1]} & {*COLUMN_PARALLEL, "embedding"} else len(shape) - 2
            if shape[axis] % tp == 0:
                entries[axis] = "model"
        free = [a for a in range(len(shape)) if entries[a] is None and shape[a] % data == 0]
        if free and data > 1 and "data" not in entries:
            entries[max(free, key=lambda a: (shape[a], -a))] = "data"
        specs.append(P(*entries))
    return jax.tree_util.tree_unflatten(treedef, specs)


def random_specs(shapes, data: int, tp: int, seed: int):
    """A layout drawn at random, leaf by leaf in the tree's order (``random.Random(seed)``): the FSDP
    axis ('data') drawn uniformly among the leaf's axes that ``data`` divides, or none (replicated);
    then, with ``tp > 1`` and a leaf of two or more axes, 'model' on its fan-in (axis -2), its fan-out
    (axis -1) or neither, among those free and divisible. Layouts a user may pick, none chosen by us."""
    rng = random.Random(seed)
    flat, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=lambda s: isinstance(s, tuple))
    specs = []
    for shape in flat:
        entries: list = [None] * len(shape)
        free = [a for a in range(len(shape)) if shape[a] % data == 0] if data > 1 else []
        axis = rng.choice([*free, None]) if free else None
        if axis is not None:
            entries[axis] = "data"
        if tp > 1 and len(shape) >= 2:
            sides = [a for a in (len(shape) - 2, len(shape) - 1) if entries[a] is None and shape[a] % tp == 0]
            side = rng.choice([*sides, None]) if sides else None
            if side is not None:
                entries[side] = "model"
        specs.append(P(*entries))
    return jax.tree_util.tree_unflatten(treedef, specs)


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
    shapes, geometry = tree_shapes(tree, scan)
    is_shape = lambda s: isinstance(s, tuple)
    mode = AxisType.Explicit if mesh_kind == "explicit" else AxisType.Auto
    if n % (tp * replicas):
        raise SystemExit(f"--tp {tp} x --replicas {replicas} must divide --devices {n}")
    data = n // (tp * replicas)
    axis_shape, names = ((data, tp), ("data", "model")) if tp > 1 else ((data,), ("data",))
    if replicas > 1:  # parameters replicated over 'replica' (multi-slice training): no spec names it
        axis_shape, names = (replicas, *axis_shape), ("replica", *names)
    mesh = jax.make_mesh(axis_shape, names, axis_types=(mode,) * len(names), devices=jax.devices()[:n])
    specs = partition_specs(shapes, data, tp, layout, seed)
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
    ap.add_argument("--tree", choices=sorted(TREES), default="llama1b")
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
