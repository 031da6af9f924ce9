"""The layout matrix: every named optimizer x axis type x mesh layout x tree, on 8 host devices.

Each case jits one update on sharded arrays and checks that it equals the same update on
one device (float32, relative 1e-5 of each leaf's scale) and that the updates keep the
parameters' shardings and, on Explicit meshes, the new state its input state's (the shardings
jit returns, compared by ``is_equivalent_to``; on Auto meshes the state's layout is XLA's
choice after the first step, and the second step must keep it). Layouts (a kernel's fan-in / fan-out from its geometry;
an axis is sharded only where the mesh axis divides it):

* ``one``: a mesh of one device;
* ``fsdp``: ``('data',) = (8,)``, the largest divisible axis over ``data``;
* ``fsdp_tp``: ``('data', 'model') = (4, 2)``, fan-in over ``data``, fan-out over ``model``;
* ``row_parallel``: the same mesh, fan-in over ``model`` (Megatron's row-parallel ``o`` /
  ``down``), fan-out over ``data``;
* ``tp``: ``('model',) = (8,)``, fan-out over ``model`` only;
* ``replicated``: ``('data',) = (8,)``, every leaf ``P()``.

Trees: fewer matrices than devices, more, a fused QKV (``c_attn``), an ``nn.scan`` stack, a
4-D expert stack under a layer stack, leaves whose dimensions divide no mesh axis.

The fast tier runs a covering subset (every pair of 2-D layout and tree, each optimizer on both
2-D layouts and both axis types, each 1-D layout on both axis types); ``-m slow`` runs the whole
matrix, one subprocess per optimizer.
"""

import itertools

import pytest
from test_sharding import run_script

OPTIMIZERS = ("muon", "normuon", "moga", "spectral_sgd", "mup_adamw", "contrib_muon")
AXIS_TYPES = ("Explicit", "Auto")
LAYOUTS = ("one", "fsdp", "fsdp_tp", "row_parallel", "tp", "replicated")
TREES = ("few", "many", "fused_qkv", "scan", "experts", "indivisible")

SCRIPT = """
import itertools, sys
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so

assert jax.device_count() == 8, jax.devices()
MATRIX = {"kind": "matrix", "fan_in_axes": (-2,), "fan_out_axes": (-1,)}
TREES = {
    "few": ({f"b{i}": {"fc": {"kernel": (64, 256)}, "fc2": {"kernel": (256, 64)}} for i in range(2)}, None),
    "many": ({"embed": {"embedding": (64, 32)}, "norm": {"scale": (32,)},
              **{f"b{i}": {"q": {"kernel": (32, 32)}, "fc": {"kernel": (32, 128), "bias": (128,)},
                           "fc2": {"kernel": (128, 32)}} for i in range(6)}}, None),
    "fused_qkv": ({f"h{i}": {"attn": {"c_attn": {"kernel": (32, 96), "bias": (96,)},
                                      "c_proj": {"kernel": (32, 32)}}} for i in range(2)}, None),
    "scan": ({"blocks": {"fc": {"kernel": (4, 32, 64)}, "fc2": {"kernel": (4, 64, 32)}, "ln": {"scale": (4, 32)}}},
             {r"^blocks/.*/kernel$": MATRIX, r"^blocks/ln/scale$": {"kind": "vector", "fan_out_axes": (-1,)}}),
    "experts": ({"layers": {"moe": {"wi": {"kernel": (2, 4, 32, 64)}, "wo": {"kernel": (2, 4, 64, 32)}},
                            "router": {"kernel": (2, 32, 4)}}},
                {r"^layers/moe/.*/kernel$": MATRIX, r"^layers/router/kernel$": MATRIX}),
    "indivisible": ({"odd": {"kernel": (7, 13)}, "w": {"kernel": (33, 65)}, "v": {"bias": (5,)}}, None),
}
LAYOUTS = {  # mesh shape, axis names, (fan-in entry, fan-out entry, largest-axis entry)
    "one": ((1,), ("data",), (None, None, "data")),
    "fsdp": ((8,), ("data",), (None, None, "data")),
    "fsdp_tp": ((4, 2), ("data", "model"), ("data", "model", None)),
    "row_parallel": ((4, 2), ("data", "model"), ("model", "data", None)),
    "tp": ((8,), ("model",), (None, "model", None)),
    "replicated": ((8,), ("data",), (None, None, None)),
}
OPTIMIZERS = {
    "muon": lambda g: so.muon(1e-2, geometry=g),
    "normuon": lambda g: so.normuon(1e-2, geometry=g),
    "moga": lambda g: so.moga(1e-2, geometry=g),
    "spectral_sgd": lambda g: so.spectral_sgd(1e-2, geometry=g),
    "mup_adamw": lambda g: so.mup_adamw(1e-3, geometry=g),
    # the package's optax.contrib.muon (every 2-D leaf a matrix, no geometry): it must run on every mesh,
    # Explicit meshes that shard a contracted axis included (optax's own does not: docs/sharding.md)
    "contrib_muon": lambda g: so.contrib_muon(1e-2),
}


def specs_for(tree, geometry, layout, sizes):
    fan_in_name, fan_out_name, largest_name = layout
    is_shape = lambda s: isinstance(s, tuple)
    plain = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tree, is_leaf=is_shape)
    geoms = dict(so.as_geometry_map(geometry).leaves(plain))
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_shape)
    out = []
    for path, shape in flat:
        g = geoms["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)]
        entries = [None] * len(shape)
        def put(axes, name):
            for a in axes:
                a = a % len(shape)
                if name and entries[a] is None and name not in entries and shape[a] % sizes[name] == 0:
                    entries[a] = name
                    return
        if g.kind == "matrix":
            put(g.fan_in_axes, fan_in_name)
            put(g.fan_out_axes, fan_out_name)
        if largest_name:
            put(sorted(range(len(shape)), key=lambda a: -shape[a]), largest_name)
        out.append(P(*entries))
    return jax.tree_util.tree_unflatten(treedef, out)


def close(a, b, name):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(np.max(np.abs(b), initial=0.0), 1e-30), err_msg=name)


def same_layout(got, want, what):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        if getattr(x, "ndim", 0) and hasattr(y, "sharding"):
            assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (what, path, x.sharding, y.sharding)


reference = {}
for opt, axis_type, layout, tree_name in CASES:
    shapes, geometry = TREES[tree_name]
    is_shape = lambda s: isinstance(s, tuple)
    keys = iter(jax.random.split(jax.random.key(0), 64))
    params = jax.tree.map(lambda s: 0.1 * jax.random.normal(next(keys), s), shapes, is_leaf=is_shape)
    grads = jax.tree.map(lambda s: jax.random.normal(next(keys), s), shapes, is_leaf=is_shape)
    tx = OPTIMIZERS[opt](geometry)
    if (opt, tree_name) not in reference:
        host = jax.devices()[0]
        p1, g1 = jax.device_put(params, host), jax.device_put(grads, host)
        s1 = tx.init(p1)
        u1, _ = jax.jit(tx.update)(g1, s1, p1)
        u1, _ = jax.jit(tx.update)(g1, jax.jit(tx.update)(g1, s1, p1)[1], p1)  # a second step: the state's wiring
        reference[(opt, tree_name)] = jax.tree.map(np.asarray, u1)
    shape, names, layout_names = LAYOUTS[layout]
    devices = jax.devices()[: int(np.prod(shape))]
    mesh = jax.make_mesh(shape, names, axis_types=(getattr(AxisType, axis_type),) * len(names), devices=devices)
    specs = specs_for(shapes, geometry, layout_names, dict(zip(names, shape)))
    put = lambda tree: jax.tree.map(lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), tree, specs)
    p, g = put(params), put(grads)
    state = tx.init(p)
    step = jax.jit(tx.update)
    _, state1 = step(g, state, p)
    # the state's layout is checked on Explicit meshes (in the types); on Auto meshes it is XLA's
    # choice and may change after the first step (the documented deviation, docs/sharding.md)
    if axis_type == "Explicit":
        same_layout(state1, state, "state")
    u, state2 = step(g, state1, p)
    same_layout(u, p, "updates")
    if axis_type == "Explicit":
        same_layout(state2, state, "state")
    else:  # XLA's choice after the first step, then kept: the step recompiles once, never again
        same_layout(state2, state1, "state after the second step")
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(u)[0], jax.tree.leaves(reference[(opt, tree_name)])):
        close(x, y, f"{opt} {axis_type} {layout} {tree_name} {jax.tree_util.keystr(path)}")
    print("ok", opt, axis_type, layout, tree_name, flush=True)
"""


TWO_D = ("fsdp_tp", "row_parallel")  # the layouts of issue 31's regressions


def covering_cases():
    """Every (2-D layout, tree) pair once, optimizers and axis types rotating over them so each
    optimizer meets both 2-D layouts on both axis types; each 1-D layout once per axis type."""
    cases = []
    for (j, layout), (t, tree) in itertools.product(enumerate(TWO_D), enumerate(TREES)):
        cases.append((OPTIMIZERS[(t + 2 * j) % len(OPTIMIZERS)], AXIS_TYPES[(t + j) % 2], layout, tree))
    one_d = [layout for layout in LAYOUTS if layout not in TWO_D]
    for i, (layout, axis_type) in enumerate(itertools.product(one_d, AXIS_TYPES)):
        cases.append((OPTIMIZERS[(i + 3) % len(OPTIMIZERS)], axis_type, layout, TREES[i % len(TREES)]))
    return cases


def _run(cases, timeout=1500):
    out = run_script(f"CASES = {cases!r}\n" + SCRIPT, devices=8, timeout=timeout)
    for case in cases:
        assert "ok " + " ".join(case) + "\n" in out, (case, out[-3000:])


def test_covering_cases_cover_every_pair():
    cases = covering_cases()
    pairs = lambda a, b, among=cases: {(c[a], c[b]) for c in among}
    two_d = [c for c in cases if c[2] in TWO_D]
    assert pairs(2, 3, two_d) == set(itertools.product(TWO_D, TREES))
    assert pairs(0, 2, two_d) == set(itertools.product(OPTIMIZERS, TWO_D))
    assert pairs(0, 1) == set(itertools.product(OPTIMIZERS, AXIS_TYPES))
    assert pairs(1, 2) == set(itertools.product(AXIS_TYPES, LAYOUTS))
    assert pairs(1, 3) == set(itertools.product(AXIS_TYPES, TREES))
    assert len(set(cases)) == len(cases) == 20


@pytest.mark.parametrize("half", [0, 1])
def test_layout_matrix_covering_subset(half):
    _run(covering_cases()[half::2])  # two subprocesses, so that the fast tier's two workers share them


GUARD = """
import re, sys, time
import jax, jax.numpy as jnp, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import spectral_optax as so

assert jax.device_count() == 64
stacked = sys.argv[1] == "stacked"
mesh = jax.make_mesh((8, 8), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
kernels = {"q": (512, 512), "o": (512, 512), "up": (512, 1536), "down": (1536, 512)}
if stacked:  # nn.scan: the layers on a leading (batch) axis, unsharded
    shapes, spec, geometry = {"blocks": {k: (16, *s) for k, s in kernels.items()}}, P(None, "data", "model"), {
        r"^blocks/": {"kind": "matrix", "fan_in_axes": (-2,), "fan_out_axes": (-1,)}}
else:
    shapes, spec, geometry = {f"h{i}": dict(kernels) for i in range(16)}, P("data", "model"), None
tiles = NamedSharding(mesh, spec)  # every kernel (fan-in, fan-out) over (data, model)
tree = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32, sharding=tiles), shapes,
                    is_leaf=lambda s: isinstance(s, tuple))
plan = so.expert.orthogonalization_plan(tree, geometry=geometry, flops_per_byte=1.0)
assert all(g.split == 2 and g.owners == 32 for g in plan.groups), plan


def compiled(tx):
    def step(g, p):
        return optax.apply_updates(p, tx.update(g, tx.init(p), p)[0])

    with jax.set_mesh(mesh):
        t0 = time.perf_counter()
        text = jax.jit(step).lower(tree, tree).compile().as_text()
    return time.perf_counter() - t0, text


base, _ = compiled(so.muon(0.02, geometry=geometry, distribute=False))
seconds, text = compiled(so.muon(0.02, geometry=geometry, flops_per_byte=1.0))
print(f"RESULT {seconds / base:.3f} {len(re.findall(r' all-to-all[(]', text))}")
"""


@pytest.mark.parametrize("layout", ["leaves", "stacked"])
def test_2d_tiled_split_groups_route_through_bounded_all_to_alls(layout):
    """Regression guard for a plan whose program grows as leaves x devices: 64 kernels tiled
    P('data', 'model') on 64 host devices, split k = 2 (the route of Llama 6.7B on a 32 x 8 mesh),
    as 64 leaves or as four ``nn.scan`` stacks of 16 (``P(None, 'data', 'model')``, the layer axis a
    batch axis, on the same all-to-all route as the leaves). The all-to-all count is exact on any
    machine and asserted; the compile-time ratio to the ``distribute=False`` program is printed, not
    asserted (a timing on a shared machine: ``benchmarks.pod_scale`` measures compile seconds; today's
    figures: docs/benchmarks.md, "2-D meshes: FSDP x TP"; before and after each fix: docs/lab_log.md,
    "2-D layouts: FSDP x TP at 256 and 1024 devices (measured 2026-12-04)"; the design:
    docs/sharding.md, "2-D layouts: FSDP x TP")."""
    out = run_script(GUARD, devices=64, timeout=900, args=[layout])
    ratio, all_to_all = out.split("RESULT ")[1].split()
    print(f"compile-time ratio to distribute=False ({layout}): {float(ratio):.2f}")
    assert int(all_to_all) <= 16, out[-2000:]  # one per tiling class and direction, + the deals


#: A known defect, open (2026-12-07): on an Explicit FSDP mesh, a tree whose Muon partition holds no sharded
#: leaf, ``so.contrib_muon``'s ``init`` leaves ``ns_coeffs`` on one device while the step returns it on the mesh
#: (``P()``): the state's layout changes after the first step. Its updates equal one device's in every case run
#: before it; the fast tier's covering cases pass.
KNOWN: dict[str, str] = {}  # optimizer -> a known open defect (xfail with its cause); none today


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer",
    [pytest.param(o, marks=pytest.mark.xfail(reason=KNOWN[o], strict=False)) if o in KNOWN else o for o in OPTIMIZERS],
)
def test_layout_matrix_every_case(optimizer):
    _run([(optimizer, *rest) for rest in itertools.product(AXIS_TYPES, LAYOUTS, TREES)], timeout=3000)
