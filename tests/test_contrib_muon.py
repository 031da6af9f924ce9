"""``so.contrib_muon`` against the installed ``optax.contrib.muon`` (the oracle): same arguments, same updates.

Every case feeds both optimizers the same parameters and the same gradient sequence (independent of
the parameters, so a rounding difference cannot grow through the trajectory) and compares every
step's updates leaf by leaf, relative to the leaf's largest entry. The deliberate differences of
``contrib_muon``'s docstring each have a test below.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers as Dims

import spectral_optax as so

STEPS = 3
RTOL = 2e-5  # float32: the two iterations round differently (engine: batched, Gram space where it saves flops)


def _tree(kind: str, rng):
    r = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    if kind == "plain":  # contrib's default rule: 2-D -> Muon, the rest -> AdamW
        return {"w": r(10, 12), "tall": r(16, 5), "b": r(7), "cube": r(2, 3, 4), "s": r()}, None
    if kind == "dims":  # stacked layers (L, d_in, d_out), attention kernels, an MoE stack, a prefix tree
        dims = {
            "layers": Dims(1, 2),  # nn.scan-stacked (L, d_in, d_out)
            "down": Dims(-2, -1),  # stacked and tall (Gram space)
            "q": Dims(0, (1, 2)),  # (d_model, heads, head_dim)
            "o": Dims((0, 1), 2),  # (heads, head_dim, d_model)
            "moe": Dims(2, 1),  # (experts, d_out, d_in, 2): output before reduction, two batch axes
            "dec": {"a": None, "b": Dims(1, 0)},  # a None leaf (AdamW) and a transposed spec
            "enc": Dims(),  # a spec for a whole subtree
            "n": None,
        }
        tree = {
            "layers": r(3, 6, 9), "down": r(2, 12, 4), "q": r(8, 2, 3), "o": r(2, 3, 8), "moe": r(2, 5, 7, 2),
            "dec": {"a": r(5, 5), "b": r(3, 7)}, "enc": {"x": r(4, 6), "y": r(6, 4)}, "n": r(8),
        }  # fmt: skip
        return tree, dims
    if kind == "callable":
        return {"w": r(6, 9), "v": r(2, 4, 4), "b": r(9)}, (
            lambda p: jax.tree.map(lambda x: Dims(x.ndim - 2, x.ndim - 1) if x.ndim >= 2 else None, p)
        )
    raise AssertionError(kind)


def _run(tx, params, grads):
    state = tx.init(params)
    out = []
    for g in grads:
        u, state = jax.jit(tx.update)(g, state, params)
        out.append(u)
        params = optax.apply_updates(params, u)
    return out, state


def _check(got, want, rtol=RTOL):
    worst = 0.0
    for step, (g, w) in enumerate(zip(got, want)):
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(w), jax.tree.leaves(g)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape and a.dtype == b.dtype, (path, a.dtype, b.dtype)
            ref = float(np.max(np.abs(a))) or 1.0
            err = float(np.max(np.abs(a - b))) / ref
            assert err <= rtol, f"step {step} {jax.tree_util.keystr(path)}: relative error {err:.2e}"
            worst = max(worst, err)
    return worst


def _compare(kwargs, kind, seed=0, rtol=RTOL):
    rng = np.random.default_rng(seed)
    params, dims = _tree(kind, rng)
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params) for _ in range(STEPS)]
    if dims is not None:
        kwargs = {**kwargs, "muon_weight_dimension_numbers": dims}
    want, _ = _run(optax.contrib.muon(0.03, **kwargs), params, grads)
    got, _ = _run(so.contrib_muon(0.03, **kwargs), params, grads)
    return _check(got, want, rtol)


ARGS = {
    "defaults": {},
    "spectral": {"preconditioning": "spectral"},
    "dion_aol": {"ns_coeffs": "dion", "preconditioning": "aol"},
    "table_short": {"ns_coeffs": ((4.0, -6.0, 2.5), (3.4445, -4.7750, 2.0315)), "ns_steps": 3},
    "triple_3_steps": {"ns_coeffs": (3.0, -3.2, 1.2), "ns_steps": 3},
    "adaptive_plain_momentum": {"adaptive": True, "nesterov": False, "beta": 0.8},
    "consistent_rms": {"consistent_rms": 0.2},
    "decay_masked": {
        "weight_decay": 0.1,
        "weight_decay_mask": lambda p: jax.tree.map(lambda x: x.ndim != 3, p),
        "adam_weight_decay": 0.05,
    },
    "adam_args": {
        "adam_b1": 0.7,
        "adam_b2": 0.9,
        "adam_eps_root": 1e-6,
        "eps": 1e-4,
        "adam_learning_rate": optax.linear_schedule(0.01, 0.0, 4),
    },  # fmt: skip
}
# The arguments that act per matrix, on the dimension-number tree.
DIMS_ARGS = {
    "defaults": {},
    "aol": {"preconditioning": "aol"},
    "schatten": {"preconditioning": "schatten"},
    "adaptive_plain_momentum": ARGS["adaptive_plain_momentum"],
    "consistent_rms": ARGS["consistent_rms"],
}
# Largest relative error over 3 seeds (2026-12-07, CPU): 6.4e-6, except eps=1e-4 (adam_args): 6.9e-5, contrib's
# ||G||_F + eps normalization (eps / ||G||_F ~ 1e-5, amplified at the small singular values; see below).
TOLERANCE = {"adam_args": 3e-4}


FAST = {"defaults", "spectral", "dion_aol", "adaptive_plain_momentum", "aol"}  # the rest: slow tier


def _tiered(names):
    return [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(names)]


@pytest.mark.parametrize("name", _tiered(ARGS))
def test_updates_match_optax_contrib_muon(name):
    _compare(dict(ARGS[name]), "plain", rtol=TOLERANCE.get(name, RTOL))


@pytest.mark.parametrize("name", _tiered(DIMS_ARGS))
def test_dimension_numbers_match_optax_contrib_muon(name):
    _compare(dict(DIMS_ARGS[name]), "dims")


def test_callable_dimension_numbers_match_optax_contrib_muon():
    _compare({"preconditioning": "aol"}, "callable")


def test_signature_is_contribs():
    """The same parameters, in the same order, kinds and defaults as the installed optax.contrib.muon."""
    ours = inspect.signature(so.contrib_muon).parameters
    theirs = inspect.signature(optax.contrib.muon).parameters
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        assert ours[name].kind == p.kind, name
        want = p.default if not isinstance(p.default, tuple) else tuple(p.default)
        assert ours[name].default == want, (name, ours[name].default, want)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"preconditioning": "aol"}]
    + [pytest.param(k, marks=pytest.mark.slow) for k in ({"adaptive": True}, {"nesterov": False})],
)
def test_complex_leaves_match(kwargs):
    """Complex leaves (contrib's complex tests: conjugated gradients, ``X X^H``), on the written-out iteration."""
    rng = np.random.default_rng(3)
    c = lambda *s: jnp.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s), jnp.complex64)
    params = {"z": c(3, 5), "sq": c(2, 2), "v": c(4)}
    grads = [jax.tree.map(lambda x: c(*x.shape), params) for _ in range(STEPS)]
    want, _ = _run(optax.contrib.muon(0.01, **kwargs), params, grads)
    got, _ = _run(so.contrib_muon(0.01, **kwargs), params, grads)
    _check(got, want)


def test_complex_schatten_uses_the_conjugate_gram():
    """Deliberate difference: complex ``'schatten'`` forms ``X X^H`` (contrib ``X X^T``); on a complex
    leaf with zero imaginary part the two agree."""
    rng = np.random.default_rng(4)
    real = {"z": jnp.asarray(rng.standard_normal((4, 6)), jnp.complex64)}
    grads = [real] * 2
    want, _ = _run(optax.contrib.muon(0.01, preconditioning="schatten"), real, grads)
    got, _ = _run(so.contrib_muon(0.01, preconditioning="schatten"), real, grads)
    _check(got, want)
    z = {"z": jnp.asarray(rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6)), jnp.complex64)}
    kw = {"preconditioning": "schatten", "ns_coeffs": (2.0, -1.5, 0.5), "ns_steps": 30}  # converges to U V^H
    got, _ = _run(so.contrib_muon(1.0, **kw), z, [z])
    u = np.asarray(got[0]["z"])  # -lr * sqrt(6/4) * U V^H: orthonormal rows after unscaling
    np.testing.assert_allclose((u @ u.conj().T) / 1.5, np.eye(4), atol=1e-4)


def test_frobenius_eps_is_not_added():
    """Deliberate difference: the engine normalizes by ``||G||_F`` (contrib by ``||G||_F + eps``). On a
    gradient of norm ~1e-7 that is contrib with ``eps=0``, not contrib with its default ``eps``."""
    rng = np.random.default_rng(5)
    params = {"w": jnp.asarray(rng.standard_normal((6, 8)), jnp.float32)}
    grads = [jax.tree.map(lambda x: 1e-8 * x, params)] * 2
    got, _ = _run(so.contrib_muon(0.1), params, grads)
    exact, _ = _run(optax.contrib.muon(0.1, eps=0.0), params, grads)
    with_eps, _ = _run(optax.contrib.muon(0.1), params, grads)
    _check(got, exact)
    assert not np.allclose(got[0]["w"], with_eps[0]["w"], rtol=1e-2)


def test_state_has_contribs_structure_and_restores_from_it():
    """``state.inner_states['muon']`` and ``['adam']`` have contrib's structure (plus a ``'frozen'``
    route); contrib's state after two steps, restored into ours, continues as contrib does."""
    rng = np.random.default_rng(6)
    params, dims = _tree("dims", rng)
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params) for _ in range(3)]
    theirs = optax.contrib.muon(0.03, muon_weight_dimension_numbers=dims)
    ours = so.contrib_muon(0.03, muon_weight_dimension_numbers=dims)
    s_theirs, s_ours = theirs.init(params), ours.init(params)
    assert set(s_ours.inner_states) == {"muon", "adam", "frozen"}
    for route in ("muon", "adam"):
        assert jax.tree.structure(s_ours.inner_states[route]) == jax.tree.structure(s_theirs.inner_states[route])
    assert isinstance(s_ours.inner_states["muon"][0][0], optax.contrib.MuonState)
    step = jax.jit(theirs.update)
    for g in grads[:2]:
        _, s_theirs = step(g, s_theirs, params)
    restored = s_ours._replace(inner_states={**s_ours.inner_states, **s_theirs.inner_states})
    want, _ = step(grads[2], s_theirs, params)
    got, _ = jax.jit(ours.update)(grads[2], restored, params)
    _check([got], [want])


def test_bad_arguments_rejected_as_contrib_does():
    with pytest.raises(ValueError, match="preset"):
        so.contrib_muon(0.1, ns_coeffs="nope")
    with pytest.raises(ValueError, match="preconditioning"):
        so.contrib_muon(0.1, preconditioning="nope")
    with pytest.raises(ValueError, match="Not enough coeffs"):
        so.contrib_muon(0.1, ns_coeffs="dion", ns_steps=3)
    tx = so.contrib_muon(0.1, muon_weight_dimension_numbers={"w": Dims(0, 0)})
    params = {"w": jnp.ones((3, 4))}
    with pytest.raises(ValueError, match="overlap"):
        tx.update(params, tx.init(params), params)


@pytest.mark.slow
def test_on_an_explicit_mesh_matches_unsharded_contrib_and_keeps_the_shardings():
    """On a 4-device Explicit mesh (kernels sharded on either axis, a stacked leaf on its stack axis) the
    engine's distributed plan runs (``all-to-all`` in the program) and the updates equal the installed
    contrib's on the same values unsharded (contrib itself raises ``ShardingTypeError`` there)."""
    import os
    import subprocess
    import sys
    import textwrap

    from conftest import xla_flags

    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np, optax
        from jax.sharding import NamedSharding, PartitionSpec as P
        from optax.contrib import MuonDimensionNumbers as D
        import spectral_optax as so

        mesh = jax.make_mesh((4,), ("d",))
        rng = np.random.default_rng(0)
        specs = {"a": P(None, "d"), "b": P("d", None), "s": P("d", None, None), "v": P("d")}
        shapes = {"a": (16, 64), "b": (64, 16), "s": (4, 8, 32), "v": (32,)}
        host = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}
        params = {k: jax.device_put(x, NamedSharding(mesh, specs[k])) for k, x in host.items()}
        dims = {"a": D(), "b": D(), "s": D(1, 2), "v": None}
        grads = [jax.tree.map(lambda x: x * (i + 1) * 0.3 + 0.1, params) for i in range(3)]
        tx = so.contrib_muon(0.03, muon_weight_dimension_numbers=dims)
        state, step = tx.init(params), jax.jit(tx.update)
        assert "all-to-all" in step.lower(grads[0], state, params).compile().as_text()
        ref = optax.contrib.muon(0.03, muon_weight_dimension_numbers=dims)
        rstate = ref.init(host)
        for g in grads:
            u, state = step(g, state, params)
            w, rstate = ref.update(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), g), rstate, host)
            for k in shapes:
                assert u[k].sharding.spec == specs[k], (k, u[k].sharding)
                err = float(jnp.max(jnp.abs(np.asarray(u[k]) - w[k])) / jnp.max(jnp.abs(w[k])))
                assert err < 2e-5, (k, err)
        print("ok")
        """
    )
    env = {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=4"), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
