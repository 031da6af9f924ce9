"""What the traced geometry adds to ``init``, on the package's Linen GPT.

For ``so.nn.linen.Transformer`` at a given depth, in one process, medians of
``--repeats`` runs (a fresh ``jax.jit`` each time, so every run traces):

* ``init``: ``jax.jit(model.init)(key, tokens)``: trace, compile, run;
* ``init_with_geometry``: ``so.init_with_geometry(model, key, tokens)``: one
  ``jax.jit(init).trace`` (the module hints recorded in it), the geometry walk
  of its jaxpr, and that same trace lowered, compiled and run for the variables;
* the same two up to the lowered computation only (no compile, no run), where
  the difference is the geometry's cost without the compile-time noise;
* its parts: the model trace, the walk, and
  ``GeometryMap.from_linen`` (shapes only, no values).

    python -m benchmarks.trace_geometry_time --blocks 48 [--no-scan] [--repeats 3] [--compile-repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import spectral_optax as so
from spectral_optax._geometry import _linen_init_trace


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

    def lowered_one_trace():
        _, tr = _linen_init_trace(model, key, (tokens,), {})
        tr.decisions()
        return tr.lowered()

    def walk():
        _, tr = _linen_init_trace(model, key, (tokens,), {})
        t0 = time.perf_counter()
        tr.decisions()
        return time.perf_counter() - t0

    jax.jit(model.init).lower(key, tokens)  # warm-up (JAX's own first-call costs)
    lowered_one_trace()
    rows = []
    c_rep = args.repeats if args.compile_repeats is None else args.compile_repeats
    if c_rep > 0:
        t_init = _median_time(lambda: jax.jit(model.init)(key, tokens), c_rep)
        t_both = _median_time(lambda: so.init_with_geometry(model, key, tokens)[0], c_rep)
        rows += [("init (jit: trace + compile + run)", t_init), ("init_with_geometry (one trace)", t_both)]
        rows.append(("  added by the geometry", t_both - t_init))
    l_init = _median_time(lambda: jax.jit(model.init).lower(key, tokens) and 0, args.repeats)
    l_both = _median_time(lambda: lowered_one_trace() and 0, args.repeats)
    rows += [("init, to lowered (trace + lower)", l_init), ("init_with_geometry, to lowered", l_both)]
    rows.append(("  added by the geometry", l_both - l_init))
    rows.append(("model trace: jit(init).trace, hints recorded", _median_time(
        lambda: _linen_init_trace(model, key, (tokens,), {}) and 0, args.repeats)))  # fmt: skip
    rows.append(("geometry walk of that jaxpr", statistics.median(walk() for _ in range(args.repeats))))
    rows.append(("GeometryMap.from_linen (no values)", _median_time(
        lambda: so.GeometryMap.from_linen(model, tokens) and 0, args.repeats)))  # fmt: skip
    n = len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, key, tokens)))
    print(f"Transformer blocks={args.blocks} features={args.features} scan={not args.no_scan} leaves={n}")
    for name, t in rows:
        print(f"  {name:44s} {t:8.3f} s")


if __name__ == "__main__":
    main()
