"""What tracing the forward pass for the geometry costs, next to ``init``.

For the package's Linen GPT (``so.nn.linen.Transformer``) at a given depth,
in one process: the wall time of ``model.init`` (jitted, compiled and run),
of ``GeometryMap.from_linen(model, tokens)`` with its trace and without it
(module hints only), of the trace alone and of the bare ``jax.make_jaxpr`` of
``model.apply`` inside it. Medians of ``--repeats`` runs.

    python -m benchmarks.trace_geometry_time --blocks 48 [--no-scan]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import spectral_optax as so
from spectral_optax._geometry import _hints_from_linen
from spectral_optax._trace import trace_geometry


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=48)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--no-scan", action="store_true", help="unrolled blocks (scan=False)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    model = so.nn.linen.Transformer(
        vocab_size=512, features=args.features, num_heads=4, num_blocks=args.blocks, max_len=64, scan=not args.no_scan
    )
    tokens = jnp.zeros((1, 64), jnp.int32)

    def init():
        return jax.jit(model.init)(jax.random.key(0), tokens)  # a fresh jit each time: trace + compile + run

    params = init()["params"]

    def trace():
        return trace_geometry(lambda p, x: model.apply({"params": p}, x), params, tokens)

    t_init = _median_time(init, args.repeats)
    t_map = _median_time(lambda: so.GeometryMap.from_linen(model, tokens), args.repeats)
    t_hints = _median_time(lambda: _hints_from_linen(model, (tokens,), {}), args.repeats)
    t_trace = _median_time(trace, args.repeats)
    t_jaxpr = _median_time(lambda: jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens))(params), args.repeats)
    n = len(jax.tree_util.tree_leaves(params))
    print(f"Transformer blocks={args.blocks} features={args.features} scan={not args.no_scan} leaves={n}")
    print(f"  init (jit + run)             {t_init:8.3f} s")
    print(f"  from_linen (hints + trace)   {t_map:8.3f} s")
    print(f"  hints only                   {t_hints:8.3f} s")
    print(f"  trace_geometry alone         {t_trace:8.3f} s   (added by tracing: {t_map - t_hints:.3f} s)")
    print(f"  of which make_jaxpr(apply)   {t_jaxpr:8.3f} s   (Flax's apply, traced once)")


if __name__ == "__main__":
    main()
