"""Golden updates: every named optimizer's first three updates on fixed trees, recorded from main.

They pin behaviour while modules move: ``tests/test_golden.py`` recomputes every case and compares
it with ``tests/golden/updates.npz``. Cases: nine named optimizers x four trees

* ``scan_fused``: :class:`spectral_optax.nn.linen.Transformer` with ``scan=True`` and a fused QKV
  projection (geometry by the trace of the model: layer stacks, fused splits, embeddings, norms);
* ``split_unrolled``: the same model unrolled with separate q, k, v projections;
* ``names``: a hand-written tree decided by the name rules alone (a ``qkv/kernel`` fused block, a
  3-D stacked kernel under an override, an embedding, a bias, a scale, a read-out);
* ``names_bf16``: that tree in bfloat16 (params and gradients);

plus ``sharded``: ``muon``, ``moga`` and ``mup_adamw`` on the ``names`` tree over a 2 x 2 Explicit
mesh (4 host devices), recorded separately (run in a subprocess with the device count set).

Record (on a reviewed main, before moving code): ``python tools/golden_updates.py --record``
(add ``--sharded`` in a process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "updates.npz")
GOLDEN_SHARDED = os.path.join(ROOT, "tests", "golden", "updates_sharded.npz")
STEPS = 3


def optimizers():
    import spectral_optax as so

    return {
        "muon": lambda g: so.muon(0.02, weight_decay=0.01, geometry=g),
        "normuon": lambda g: so.normuon(0.02, weight_decay=0.01, geometry=g),
        "moga": lambda g: so.moga(0.02, geometry=g),
        "moga_p1_col": lambda g: so.moga(0.02, p=1.0, variant="col", weight_decay=0.01, geometry=g),
        "spectral_sgd": lambda g: so.spectral_sgd(0.02, geometry=g),
        "mup_sgd": lambda g: so.mup_sgd(0.02, momentum=0.9, geometry=g),
        "mup_adamw": lambda g: so.mup_adamw(0.02, geometry=g),
        "rescaled_adamw": lambda g: so.rescaled_adamw(0.02, geometry=g),
        "contrib_muon": lambda g: so.contrib_muon(0.02),
    }


def _model_tree(scan: bool, qkv: str):
    import jax
    import jax.numpy as jnp

    import spectral_optax as so
    from spectral_optax.nn.linen import Transformer

    model = Transformer(vocab_size=37, features=32, num_blocks=3, num_heads=4, max_len=16, scan=scan, qkv=qkv)
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.key(0), tokens)["params"]
    geometry = so.GeometryMap.from_linen(model, tokens)
    return params, geometry


def _names_tree(dtype):
    import jax

    import spectral_optax as so

    shapes = {
        "embed": {"embedding": (37, 32)},
        "attn": {"qkv": {"kernel": (32, 96)}, "out": {"kernel": (32, 32), "bias": (32,)}},
        "layers": {"mlp": {"kernel": (3, 32, 64)}},
        "ln": {"scale": (32,)},
        "head": {"kernel": (32, 37)},
    }
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(
        treedef, [(0.1 * jax.random.normal(k, s)).astype(dtype) for k, s in zip(keys, leaves, strict=True)]
    )
    geometry = {"layers/mlp/kernel": so.Geometry.matrix((3, 32, 64), fan_in_axes=(1,), fan_out_axes=(2,))}
    return params, geometry


def trees():
    import jax.numpy as jnp

    return {
        "scan_fused": lambda: _model_tree(True, "fused"),
        "split_unrolled": lambda: _model_tree(False, "split"),
        "names": lambda: _names_tree(jnp.float32),
        "names_bf16": lambda: _names_tree(jnp.bfloat16),
    }


def grads_like(params, step: int):
    import jax

    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(100 + step), len(leaves))
    return jax.tree.unflatten(
        treedef, [jax.random.normal(k, p.shape, p.dtype) for k, p in zip(keys, leaves, strict=True)]
    )


def run_case(make_tx, params, geometry, shard=None):
    """``{path: update}`` of the last of ``STEPS`` updates (fresh gradients per step, params updated).

    The last update depends on every earlier one through the optimizer state and the params, so it
    pins the multi-step wiring (momentum, second moments, decay, counts) as well as the first step.
    """
    import jax
    import optax

    tx = make_tx(geometry)
    if shard is not None:
        params = shard(params)
    state = tx.init(params)
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))
    out = {}
    for t in range(STEPS):
        grads = grads_like(params, t)
        if shard is not None:
            grads = shard(grads)
        updates, state = step(grads, state, params)
        params = optax.apply_updates(params, updates)
    for path, leaf in jax.tree_util.tree_leaves_with_path(updates):
        out[jax.tree_util.keystr(path, simple=True, separator="/")] = np.asarray(leaf.astype("float32"))
    return out


def compute(names=None, tree_names=None):
    out = {}
    for tree_name, make_tree in trees().items():
        if tree_names is not None and tree_name not in tree_names:
            continue
        params, geometry = make_tree()
        for opt_name, make_tx in optimizers().items():
            key = f"{opt_name}|{tree_name}"
            if names is not None and key not in names:
                continue
            for k, v in run_case(make_tx, params, geometry).items():
                out[f"{key}|{k}"] = v
    return out


def compute_sharded():
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)

    def shard(tree):
        def put(x):
            # the trailing two axes over ("data", "model") where they divide evenly, else replicated
            names = [None] * x.ndim
            for ax, name in zip(range(x.ndim - 2, x.ndim), ("data", "model"), strict=True):
                if ax >= 0 and x.shape[ax] % 2 == 0:
                    names[ax] = name
            spec = P(*names)
            return jax.device_put(x, NamedSharding(mesh, spec))

        return jax.tree.map(put, tree)

    params, geometry = _names_tree(jnp.float32)
    out = {}
    opts = optimizers()
    with jax.set_mesh(mesh):
        for opt_name in ("muon", "moga", "mup_adamw"):
            for k, v in run_case(opts[opt_name], params, geometry, shard).items():
                out[f"{opt_name}|names|{k}"] = v
    return out


def fingerprint() -> str:
    """The jax version and the CPU's instruction-set flags: equal fingerprints must agree bit for bit."""
    import jax

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = " ".join(sorted(x for x in line.split() if x.startswith(("avx", "fma", "sse"))))
                    break
    except OSError:
        pass
    isa = " ".join(sorted(set(os.environ.get("XLA_FLAGS", "").split())))
    raw = f"{jax.__version__}|{platform.machine()}|{flags}|{isa}"
    return hashlib.sha1(raw.encode()).hexdigest()[:12]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--show", type=int, default=12, help="compare mode: list the N worst leaves")
    args = ap.parse_args(argv)
    path = GOLDEN_SHARDED if args.sharded else GOLDEN
    data = compute_sharded() if args.sharded else compute()
    if args.record:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez_compressed(path, __fingerprint__=np.array(fingerprint()), **data)
        print(f"wrote {len(data)} arrays to {os.path.relpath(path, ROOT)} (fingerprint {fingerprint()})")
    else:
        ref = np.load(path)
        rel = {k: float(np.max(np.abs(data[k] - ref[k])) / (np.max(np.abs(ref[k])) + 1e-30)) for k in data}
        worst = sorted(rel, key=rel.get, reverse=True)
        print(f"{len(data)} arrays; worst relative difference {rel[worst[0]]:.3g}")
        for k in worst[: args.show]:
            print(f"  {rel[k]:.3g}  {k}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
