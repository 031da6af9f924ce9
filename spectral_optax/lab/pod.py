"""The pod-scale trees and layouts (``benchmarks.pod_scale``, ``tests/test_random_layouts.py``): parameter shapes of
real models' trees, Flax-style names, with the geometry overrides their stacked and fused leaves need, and the
``PartitionSpec`` layouts a user may give them (Megatron TP + FSDP, 2-D tiles, largest-axis FSDP, random).

Shapes only: :func:`tree_shapes` gives nested dicts of shape tuples (``jax.ShapeDtypeStruct`` them, or draw
arrays), :func:`partition_specs` one ``PartitionSpec`` per leaf. Public API only.
"""

from __future__ import annotations

import random

import jax
from jax.sharding import PartitionSpec as P

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
