"""What the traced geometry adds to ``init``, on the package's Linen GPT.

For ``so.nn.linen.Transformer`` at a given depth, in one process, medians of
``--repeats`` runs (a fresh ``jax.jit`` each time, so every run traces):

* ``init``: ``jax.jit(model.init)(key, tokens)``: trace, compile, run;
* ``init_with_geometry``: ``so.init_with_geometry(model, key, tokens)``: one
  ``jax.jit(init).trace`` (the module hints recorded in it), the geometry walk
  of its jaxpr, and that same trace lowered, compiled and run for the variables;
* up to the traced computation only (no lowering, no compile, no run), where
  the difference is the geometry's cost without the compile-time noise:
  ``jax.jit(model.init).trace`` against ``so.GeometryMap.from_linen`` (that
  same one trace with the module hints recorded, and the geometry walk of its
  jaxpr; shapes only, no values).

Public API only.

    python -m benchmarks.trace_geometry_time --blocks 48 [--no-scan] [--repeats 3] [--compile-repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import spectral_optax as so


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
    ap.add_argument("--compile-repeats", type=int, default=None, help="runs of the compiled pair (default: --repeats)")
    args = ap.parse_args(argv)
    model = so.nn.linen.Transformer(
        vocab_size=512, features=args.features, num_heads=4, num_blocks=args.blocks, max_len=64, scan=not args.no_scan
    )
    tokens = jnp.zeros((1, 64), jnp.int32)
    key = jax.random.key(0)

    jax.jit(model.init).lower(key, tokens)  # warm-up (JAX's own first-call costs)
    so.GeometryMap.from_linen(model, tokens)
    rows = []
    c_rep = args.repeats if args.compile_repeats is None else args.compile_repeats
    if c_rep > 0:
        t_init = _median_time(lambda: jax.jit(model.init)(key, tokens), c_rep)
        t_both = _median_time(lambda: so.init_with_geometry(model, key, tokens)[0], c_rep)
        rows += [("init (jit: trace + compile + run)", t_init), ("init_with_geometry (one trace)", t_both)]
        rows.append(("  added by the geometry", t_both - t_init))
    t_trace = _median_time(lambda: jax.jit(model.init).trace(key, tokens) and 0, args.repeats)
    t_map = _median_time(lambda: so.GeometryMap.from_linen(model, tokens) and 0, args.repeats)
    rows += [("model trace: jit(init).trace", t_trace), ("GeometryMap.from_linen (trace, hints, walk)", t_map)]
    rows.append(("  added by the geometry (hints + walk)", t_map - t_trace))
    rows.append(("init, to lowered (trace + lower)", _median_time(
        lambda: jax.jit(model.init).lower(key, tokens) and 0, args.repeats)))  # fmt: skip
    n = len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, key, tokens)))
    print(f"Transformer blocks={args.blocks} features={args.features} scan={not args.no_scan} leaves={n}")
    for name, t in rows:
        print(f"  {name:44s} {t:8.3f} s")


if __name__ == "__main__":
    main()
