# ruff: noqa
# Issue 31 compile-time probe (run from the repo root: PYTHONPATH=. python tools/compile_probe.py N TP TREE [muon|nodist])
"""Compile-time probe for issue 31: a tree tiled P('data','model') on every 2-D leaf."""
import os, sys, time
N = int(sys.argv[1]); TP = int(sys.argv[2]); TREE = sys.argv[3]; OPT = sys.argv[4] if len(sys.argv) > 4 else "muon"
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N}"
import jax, jax.numpy as jnp, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so
from benchmarks.pod_scale import _costs
from spectral_optax.lab.pod import tree_shapes, TREES
TREES['tiny'] = (512, 16, 2048, 4096, 'llama')
TREES['tiny7b'] = (512, 32, 1536, 4096, 'llama')
from spectral_optax.lab.cli import collective_bytes
import math
shapes, geometry = tree_shapes(TREE, False)
mesh = jax.make_mesh((N // TP, TP), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
def spec(s):
    if len(s) == 2:
        return P("data" if s[0] % (N // TP) == 0 else None, "model" if s[1] % TP == 0 else None)
    return P()
is_shape = lambda s: isinstance(s, tuple)
sharded = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec(s))), shapes, is_leaf=is_shape)
tx = {"muon": lambda: so.muon(0.02, flops_per_byte=2000.0),  # an H100 pod's plan, as benchmarks.pod_scale
      "nodist": lambda: so.muon(0.02, distribute=False)}[OPT]()
def step(g, p):
    u, _ = tx.update(g, tx.init(p), p)
    return optax.apply_updates(p, u)
t0 = time.perf_counter()
with jax.set_mesh(mesh):
    lowered = jax.jit(step).lower(sharded, sharded)
t1 = time.perf_counter()
compiled = lowered.compile()
t2 = time.perf_counter()
flops, comm, temp = _costs(compiled)
shard = sum(4 * math.prod(x.shape) / math.prod(dict(mesh.shape)[a] for e in x.sharding.spec for a in ((e,) if isinstance(e, str) else (e or ()))) for x in jax.tree.leaves(sharded))
print(f"N={N} tp={TP} {TREE} {OPT}: lower {t1-t0:.1f}s compile {t2-t1:.1f}s flops/dev {flops/1e9:.2f}G bytes/shard {comm/shard:.2f} temp {temp/2**30:.2f}GiB")
import re, collections
text = compiled.as_text()
ops = collections.Counter(re.findall(r"= \S+ (all-to-all|all-gather|all-reduce|collective-permute|reduce-scatter|dot|fusion|slice|concatenate|while|conditional|copy|transpose)\(", text))
print("lines", text.count("\n"), dict(ops))
if os.environ.get("WHO"):
    src = collections.Counter()
    for line in text.splitlines():
        m = re.search(r" (transpose|copy|slice|fusion)\(.*op_name=\"([^\"]+)\"", line)
        if m:
            name = re.sub(r"\[\d+\]", "", m.group(2))
            src[(m.group(1), "/".join(name.split("/")[-3:]))] += 1
    for k, v in src.most_common(25):
        print(v, k)
