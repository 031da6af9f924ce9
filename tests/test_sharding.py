"""Optimizers under jit with sharded parameters (host CPU devices, in subprocesses).

The device count must be set before JAX starts, so every check runs in a
fresh interpreter with ``--xla_force_host_platform_device_count``. The
reference is the same optimizer on unsharded arrays on one device: sharding
must change where the arithmetic runs, never its result.
"""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(script: str, devices: int, timeout: int = 600, args: tuple | list = ()) -> str:
    env = dict(
        os.environ,
        XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        check=False, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert res.returncode == 0, res.stdout + res.stderr[-6000:]
    return res.stdout


# One leaf equal to its reference within relative 1e-5 of the leaf's scale (a script snippet).
CLOSE = """
import numpy as np


def close(a, b, name):
    # relative 1e-5 of each leaf's scale (sharded reductions sum in another order)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(np.max(np.abs(b), initial=0.0), 1e-30), err_msg=name)
"""

# Every layout of the issue on a (4, 2) mesh: FSDP, tensor-parallel, both,
# a stacked layer sharded on its layer axis, an uneven shard (30 rows over 4).
LAYOUTS = """
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
import spectral_optax as so

assert jax.device_count() == 8, jax.devices()
SHAPES = {
    "Embed_0": {"embedding": ((48, 32), P(None, "model"))},
    "Dense_0": {"kernel": ((32, 64), P("data", "model")), "bias": ((64,), P("model"))},
    "Dense_1": {"kernel": ((64, 32), P("data", None))},
    "Dense_2": {"kernel": ((32, 48), P(None, "model"))},
    "Dense_3": {"kernel": ((30, 64), P(None, "data"))},
    "stack": {"kernel": ((4, 32, 64), P("data", None, None))},
    "head": {"kernel": ((32, 10), P("data", None))},
}
GEOMETRY = {r"stack/kernel$": dict(kind="matrix", fan_in_axes=(-2,), fan_out_axes=(-1,))}
is_pair = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], P)
shapes = jax.tree.map(lambda s: s[0], SHAPES, is_leaf=is_pair)
specs = jax.tree.map(lambda s: s[1], SHAPES, is_leaf=is_pair)
keys = iter(jax.random.split(jax.random.key(0), 64))
params = jax.tree.map(lambda s: jax.random.normal(next(keys), s) / 4, shapes, is_leaf=lambda s: isinstance(s, tuple))
grads = [jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape), params) for _ in range(3)]


""" + CLOSE + """


def run(tx, tree_params, tree_grads, inner=None):
    inner = inner or (lambda g: g)
    step = jax.jit(lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(inner(g), s, p)))
    state = state0 = jax.jit(tx.init)(tree_params)
    p = tree_params
    for g in tree_grads:
        p, state = step(p, state, g)
    return p, state, state0
"""


@pytest.mark.slow
def test_every_optimizer_on_explicit_and_auto_meshes():
    """Named optimizers and transforms: 3 steps on FSDP / TP / 2-D / stacked / uneven shards
    equal the one-device run (rel 1e-5); every state leaf keeps its parameter's sharding;
    ``optax.tree_map_params`` works on every state."""
    out = run_script(
        LAYOUTS
        + """
optimizers = {  # named optimizers on both mesh kinds; the transforms alone on Explicit meshes
    "muon": lambda: so.muon(0.02, geometry=GEOMETRY, weight_decay=0.1),
    "moga": lambda: so.moga(0.01, p=2.0, geometry=GEOMETRY, weight_decay=0.1),
    "mup_adamw": lambda: so.mup_adamw(1e-3, base=params, geometry=GEOMETRY),
    "spectral_sgd": lambda: so.spectral_sgd(0.1, geometry=GEOMETRY),
    "orthogonalize(distribute=False)": lambda: so.orthogonalize_via_newton_schulz(geometry=GEOMETRY, distribute=False),
    "scale_by_spectral_norm(power)": lambda: so.scale_by_spectral_norm(method="power", geometry=GEOMETRY),
    "scale_by_column_norm": lambda: so.scale_by_column_norm(3.0, geometry=GEOMETRY),
}
explicit_only = ("mup_adamw", "spectral_sgd", "orthogonalize(distribute=False)", "scale_by_spectral_norm(power)",
                 "scale_by_column_norm")  # Auto meshes: muon and moga (CI time)
one = jax.devices()[0]
for mode in (AxisType.Explicit, AxisType.Auto):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(mode, mode))
    put = lambda t: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, specs)
    # Arrays at jit boundaries need even shards: the uneven one (30 rows over 4) is made inside the
    # Auto program by a sharding constraint on the gradient.
    uneven = None
    if mode == AxisType.Auto:
        uneven = lambda g: {**g, "Dense_3": {"kernel": jax.lax.with_sharding_constraint(
            g["Dense_3"]["kernel"], NamedSharding(mesh, P("data", None)))}}
    for name, make in optimizers.items():
        if mode == AxisType.Auto and name in explicit_only:
            continue
        tx = make()
        ref_p, ref_s, _ = run(tx, jax.device_put(params, one), jax.device_put(grads, one))
        with jax.set_mesh(mesh):  # how Explicit meshes are used (Auto ones need no context)
            p, s, s0 = run(tx, put(params), [put(g) for g in grads], uneven)
        for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((ref_p, ref_s))):
            close(a, b, name)
        # Parameters keep their shardings on Explicit meshes (the layouts are in the types). On Auto
        # meshes same-shape matrices of different layouts share one batch and come back in XLA's
        # choice (docs/sharding.md); a consistent layout is checked in the bytes test below.
        if mode == AxisType.Explicit:
            for a, spec in zip(jax.tree.leaves(p), jax.tree.leaves(specs)):
                assert a.sharding.is_equivalent_to(NamedSharding(mesh, spec), a.ndim), (name, a.sharding, spec)
        # Every parameter-like state leaf (momenta, Adam moments), found through optax.tree_map_params
        # (the parameters' shapes are all different, so the shape names the parameter).
        spec_of = {x.shape: spec for x, spec in zip(jax.tree.leaves(params), jax.tree.leaves(specs))}
        if uneven is not None:  # its gradient was resharded inside the program on purpose
            del spec_of[(30, 64)]
        # After 3 steps on both mesh kinds; right after a jitted init on Explicit meshes too (on Auto
        # meshes fresh zeros get XLA's choice of sharding, docs/sharding.md).
        states = (s, s0) if mode == AxisType.Explicit else (s,)
        like = [optax.tree_map_params(tx, lambda x: x, st, transform_non_params=lambda x: None) for st in states]
        checked = 0
        for x in jax.tree.leaves(like):
            if getattr(x, "shape", None) in spec_of:
                spec = spec_of[x.shape]
                same = x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)
                if mode == AxisType.Auto and not same:  # listed, then asserted empty by the caller
                    print("auto-layout", name, x.shape, x.sharding.spec)
                else:
                    assert same, (name, mode, x.sharding, spec)
                checked += 1
        if mode == AxisType.Auto:  # XLA's layout for the state, but kept: a further step recompiles nothing
            step = jax.jit(lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(uneven(g), s, p)))
            _, s_next = step(p, s, put(grads[0]))
            for a, b in zip(jax.tree.leaves(s_next), jax.tree.leaves(s)):
                if getattr(a, "ndim", 0):
                    assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (name, "state moved", a.sharding, b.sharding)
        print("ok", name, mode, checked)
"""
        ,
        devices=8,
    )
    for name in ("muon", "moga"):
        assert f"ok {name} AxisType.Explicit" in out and f"ok {name} AxisType.Auto" in out, out
    for name in ("mup_adamw", "spectral_sgd", "orthogonalize(distribute=False)", "scale_by_spectral_norm(power)",
                 "scale_by_column_norm"):
        assert f"ok {name} AxisType.Explicit" in out, out
    # momentum (muon, moga, on both mesh kinds) and Adam moments (mup_adamw, Explicit) were checked leaf by leaf
    checked = {tuple(line.split()[1:3]): int(line.split()[3]) for line in out.splitlines()
               if line.startswith("ok ") and len(line.split()) == 4}
    for key in [(n, m) for n in ("muon", "moga") for m in ("AxisType.Explicit", "AxisType.Auto")] + [
            ("mup_adamw", "AxisType.Explicit")]:
        assert checked.get(key, 0) > 0, (key, checked)
    # On Auto meshes the state's layout is XLA's choice (docs/sharding.md, "Optimizer state layout"):
    # with each update tied to its own gradient (its own sharding group), muon's momentum of two leaves
    # takes the plan's layout (2026-12-07). Kept from step to step (asserted in the script); at most those.
    deviations = sorted(line for line in out.splitlines() if line.startswith("auto-layout"))
    assert len(deviations) <= 2 and all(line.split()[1] == "muon" for line in deviations), deviations


def test_distributed_orthogonalization_flops_and_bytes():
    """Compiled muon update on 8 host devices, 8 FSDP kernels P('data', None): per-device flops
    <= 1.3 x total / 8 and collective bytes <= 3 x the device's parameter shard (XLA's own
    partitioning of the same update, distribute=False, misses the bytes target)."""
    out = run_script(
        """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import spectral_optax as so
from spectral_optax.lab.cli import compiled_costs

mesh = jax.make_mesh((8,), ("data",))
shape = (64, 256)
params = {f"layer{i}": {"Dense_0": {"kernel": jnp.ones(shape)}} for i in range(8)}
sh = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, P("data", None))), params)
shard_bytes = 8 * shape[0] * shape[1] * 4 / 8
method = so.expert.newton_schulz_method(*shape, 5, jnp.float32)
total = 8 * so.expert.newton_schulz_flops(*shape, 5, method)
for name, tx in (("so", so.orthogonalize_via_newton_schulz()),
                 ("xla", so.orthogonalize_via_newton_schulz(distribute=False))):
    flops, comm = compiled_costs(jax.jit(tx.update), sh, tx.init(sh))
    print(name, flops / (total / 8), comm / shard_bytes)
    if name == "so":
        out, _ = jax.jit(tx.update)(sh, tx.init(sh))  # results come back in the parameters' sharding
        for x in jax.tree.leaves(out):
            assert x.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2), x.sharding
        assert flops <= 1.3 * total / 8, (flops, total)
        assert 0 < comm <= 3 * shard_bytes, (comm, shard_bytes)
    else:
        assert comm > 3 * shard_bytes, (comm, shard_bytes)  # the target fails without distribution
# ... and muon passes its `distribute=` on to the orthogonalization (same bytes targets through the optimizer)
for distribute in (True, False):
    tx = so.muon(0.02, distribute=distribute)
    _, comm = compiled_costs(jax.jit(tx.update), sh, tx.init(sh), sh)
    print("muon", distribute, comm / shard_bytes)
    assert (0 < comm <= 3 * shard_bytes) if distribute else (comm > 3 * shard_bytes), (distribute, comm)
print("ok")
""",
        devices=8,
    )
    assert "ok" in out


def test_sweep_run_axis_over_8_devices_equals_one_device():
    """``lab.sweep(devices=8)``: 5 runs (padded to 8) split over 8 host devices; every record equals
    the one-device sweep, the programs' run axis is sharded, and resume still skips finished runs."""
    out = run_script(
        """
import json, os, tempfile
import jax, numpy as np, optax
import spectral_optax as so
from spectral_optax import lab

data = lab.digits()
fam = lab.mlp_family(data, vary="width", depth=1, init="spectral")
opt = lambda lr, n: so.muon(lr)
kw = dict(steps=6, batch_size=16, seeds=[0], progress=False, size_name="width", chunks=2)
lrs = lab.lr_grid(1e-2, 5)
tmp = tempfile.mkdtemp()
one = lab.sweep(fam, opt, [8], lrs, data, results=os.path.join(tmp, "one.jsonl"), **kw)
many = lab.sweep(fam, opt, [8], lrs, data, results=os.path.join(tmp, "many.jsonl"), devices=8, **kw)
assert len(one.runs) == len(many.runs) == 5
for a, b in zip(one.runs, many.runs):
    assert (a["lr"], a["seed"]) == (b["lr"], b["seed"])
    np.testing.assert_allclose([b["train_loss"], b["val_loss"]], [a["train_loss"], a["val_loss"]], rtol=1e-5)
    np.testing.assert_allclose(b["curve"], a["curve"], rtol=1e-5)
assert len(open(os.path.join(tmp, "many.jsonl")).read().splitlines()) == 5  # padding runs not written
again = lab.sweep(fam, opt, [8], lrs, data, results=os.path.join(tmp, "many.jsonl"), devices=8, **kw)
assert len(again.runs) == 5 and len(open(os.path.join(tmp, "many.jsonl")).read().splitlines()) == 5
print("ok sweep")
""",
        devices=8,
    )
    assert "ok sweep" in out
