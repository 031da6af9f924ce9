"""Tests written for the mutants that survived mutation testing of spectral_optax/_duals/polar/*.py and
spectral_optax/_numerics.py (Newton-Schulz / polar iteration, its policy and coefficients, numerics); see
docs/reliability.md, "Mutation testing".

They pin down: the split-matrix iteration (``axis_name``) against a float64 SVD reference, emulated on one
device with ``jax.vmap(..., axis_name=...)``; the precision of every matmul of the Gram-space restarts; the
user-function path with an explicit precision; the single rounding of the Frobenius start in bfloat16; the
documented defaults and tables of the policy; the float64 Remez solve of ``optimal_quintic``; and the cold
power iteration of ``top_singular_value``. Expected numbers come from float64 NumPy written here.
"""

import inspect
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so
from spectral_optax._duals.polar import policy
from spectral_optax._duals.polar.coefficients import POWER3_COEFFICIENTS, POWER4_COEFFICIENTS, optimal_quintic
from spectral_optax._duals.polar.iteration import newton_schulz
from spectral_optax._numerics import top_singular_value

pytestmark = pytest.mark.usefixtures("highest_precision")

QUINTIC = (3.4445, -4.7750, 2.0315)


def _polar_reference(g, steps, start="frobenius"):
    """float64: ``U p^steps(S / N) V^T`` for the Muon quintic ``p``; ``N`` the Frobenius or Schatten-4 norm."""
    u, s, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    x = s / (np.sqrt(np.sum(s**2)) if start == "frobenius" else np.sum(s**4) ** 0.25)
    for _ in range(steps):
        x = QUINTIC[0] * x + QUINTIC[1] * x**3 + QUINTIC[2] * x**5
    return (u * x) @ vt


def _split_newton_schulz(blocks, sharded_axis, **kw):
    """``newton_schulz`` on the blocks of one matrix, the split axis emulated by ``vmap`` with an axis name."""
    fn = lambda b: newton_schulz(b, "quintic", axis_name="d", sharded_axis=sharded_axis, **kw)
    return np.asarray(jax.vmap(fn, axis_name="d")(jnp.asarray(blocks, jnp.float32)))


@pytest.mark.parametrize("preconditioning", ["frobenius", "schatten"])
def test_column_split_tall_matrix_matches_float64_polar_reference(preconditioning):
    """A tall matrix split along its columns (blocks narrower than the Gram matrix) equals the float64
    reference: the Gram matrix contracts the split axis and is summed over the blocks, also in the start."""
    g = np.random.default_rng(0).standard_normal((6, 4))
    y = _split_newton_schulz(np.stack([g[:, :2], g[:, 2:]]), -1, preconditioning=preconditioning)
    np.testing.assert_allclose(np.concatenate(list(y), axis=1), _polar_reference(g, 5, preconditioning), atol=2e-5)


def test_row_split_accepts_positive_axis_and_rejects_out_of_range():
    """``sharded_axis=x.ndim - 2`` means rows (split rows match the float64 reference); an axis that is
    neither rows nor columns is rejected with a message naming the choices."""
    g = np.random.default_rng(1).standard_normal((4, 6))
    y = _split_newton_schulz(np.stack([g[:2], g[2:]]), 0)  # each block is 2-D: axis 0 is its rows
    np.testing.assert_allclose(np.concatenate(list(y), axis=0), _polar_reference(g, 5), atol=2e-5)
    with pytest.raises(ValueError, match=r"sharded_axis must be -1 \(columns\) or -2 \(rows\), got 4"):
        _split_newton_schulz(np.stack([g[:2], g[2:]]), 4)


def _dot_precisions(jaxpr):
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        for sub in jax.core.jaxprs_in_params(eqn.params):
            out.extend(_dot_precisions(sub))
    return out


def test_gram_restart_products_run_at_the_requested_precision():
    """Every matmul of the Gram-space iteration, the restarts' ``Q X`` included, carries ``precision``."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 12)), jnp.float32)
    high = jax.lax.Precision.HIGH
    fn = lambda a: newton_schulz(a, "quintic", method="gram", restarts=(1, 3), precision=high)
    precisions = _dot_precisions(jax.make_jaxpr(fn)(x).jaxpr)
    assert len(precisions) > 10
    assert all(p == (high, high) for p in precisions), precisions


def test_user_function_with_explicit_precision_gets_the_batched_matrices():
    """With ``precision`` given, a user orthogonalization function still receives the (batch, m, n)
    float32 input and its result is returned (here: the exact polar factor, float64 SVD reference)."""
    g = np.random.default_rng(3).standard_normal((2, 4, 6))
    seen = []

    def exact_polar(x):
        seen.append((x.shape, x.dtype))
        u, _, vt = jnp.linalg.svd(x, full_matrices=False)
        return u @ vt

    y = newton_schulz(jnp.asarray(g, jnp.float32), exact_polar, precision="highest")
    assert seen == [((2, 4, 6), jnp.float32)]
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    np.testing.assert_allclose(np.asarray(y), u @ vt, atol=1e-5)


def test_frobenius_start_with_safety_is_rounded_to_bfloat16_once():
    """The Frobenius start ``G / (||G||_F s)`` is formed in float32 and rounded to bfloat16 once
    (within half a bfloat16 ulp of the float64 value); the identity step ``(1, 0, 0)`` returns it."""
    g = np.random.default_rng(4).standard_normal((8, 12))
    y = newton_schulz(jnp.asarray(g, jnp.float32), [(1.0, 0.0, 0.0)], compute_dtype=jnp.bfloat16, norm_safety=1.5)
    ref = g / (np.linalg.norm(g) * 1.5)
    half_ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - 8)
    assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= half_ulp + 1e-6 * np.abs(ref))


def test_documented_defaults_and_policy_values():
    """Signature defaults, the bfloat16 restart at step 1, the float32-at-lower-precision mantissa bits,
    the ``'power'`` start's matrix-vector flops, ``steps=1`` and the padding of the power tables."""
    assert inspect.signature(so.newton_schulz).parameters["coefficients"].default == "auto"
    assert inspect.signature(top_singular_value).parameters["iters"].default == 100
    assert so.expert.power4_schedule(4, 8) == ("power4", "gram", (1,))
    assert so.expert.power4_schedule(8, 2) == ("power4", "gram", (1,))
    assert [policy._mantissa_bits(jnp.float32, p) for p in ("tensorfloat32", jax.lax.Precision.DEFAULT)] == [10, 10]
    assert policy._mantissa_bits(jnp.float16) == 10 and policy._mantissa_bits(jnp.float32) == 23
    # 'power' adds POWER_ITERATIONS * POWER_STARTS = 8 * 4 products of 2 s^2 flops (s = 4).
    for method in ("standard", "gram"):
        plain = policy.newton_schulz_flops(4, 6, 5, method)
        assert policy.newton_schulz_flops(4, 6, 5, method, preconditioning="power") - plain == 8 * 4 * 2 * 4 * 4
    assert policy.resolve_coefficients("quintic", steps=1) == ((QUINTIC,), 1.0)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        policy.resolve_coefficients("quintic", steps=0)
    for name, table in (("power3", POWER3_COEFFICIENTS), ("power4", POWER4_COEFFICIENTS)):
        padded, safety = policy.resolve_coefficients(name, steps=6)
        assert padded == tuple(table) + (table[-1],) * (6 - len(table)) and safety == 1.0


def _max_error(abc, lo, hi, n=201):
    """``max |1 - p(x)|`` over ``n`` points of ``[lo, hi]``, in exact rational arithmetic."""
    a, b, c = (Fraction(v) for v in abc)
    lo, hi = Fraction(float(lo)), Fraction(float(hi))
    xs = (lo + (hi - lo) * Fraction(i, n - 1) for i in range(n))
    return float(max(abs(1 - (a * x + b * x**3 + c * x**5)) for x in xs))


@pytest.mark.parametrize(
    "l, u",
    [(0.999994, 1.0), (np.float32(0.999), np.float32(1.0)), (np.float32(0.9999), np.float32(1.0))],
    ids=["nearly-degenerate", "float32-0.999", "float32-0.9999"],
)
def test_optimal_quintic_is_no_worse_than_the_newton_schulz_quintic(l, u):
    """The minimax quintic on ``[l, u]`` (solved in float64 to stationarity, whatever the endpoints' type)
    has a maximum error no larger than the convergent Newton-Schulz quintic ``(15, -10, 3) / 8``'s."""
    abc = optimal_quintic(l, u)
    assert all(np.isfinite(abc))
    assert _max_error(abc, l, u) <= _max_error((15 / 8, -10 / 8, 3 / 8), l, u)


def test_power_method_runs_100_cold_iterations_on_the_short_side():
    """``method='power'`` (default ``iters``) is 100 power steps on ``G^T G`` of the short side from
    ``1 + 1e-3 k``: a float64 replay matches it on a slowly converging tall and wide matrix."""
    rng = np.random.default_rng(5)
    e = 1.0 + 1e-3 * np.arange(4)
    e /= np.linalg.norm(e)
    top = rng.standard_normal(4)
    top -= (top @ e) * e
    top = top / np.linalg.norm(top) + 0.02 * e  # the start barely overlaps the top singular vector
    v, _ = np.linalg.qr(np.stack([top, e, rng.standard_normal(4), rng.standard_normal(4)], axis=1))
    u, _ = np.linalg.qr(rng.standard_normal((6, 4)))
    g = (u * np.array([1.0, 0.98, 0.5, 0.2])) @ v.T  # 6 x 4: the short side is the columns

    def replay(m):
        w = 1.0 + 1e-3 * np.arange(m.shape[1])
        for _ in range(100):
            w = m.T @ (m @ w)
            w /= np.linalg.norm(w)
        return np.linalg.norm(m @ w)

    ref = replay(g)
    assert abs(ref - 1.0) > 1e-3  # not converged: the number of steps and the side show
    got = top_singular_value(jnp.asarray(np.stack([g, 2 * g]), jnp.float32), method="power")
    np.testing.assert_allclose(np.asarray(got), [ref, 2 * ref], rtol=1e-5)
    wide = top_singular_value(jnp.asarray(np.stack([g.T] * 8), jnp.float32), method="power")
    np.testing.assert_allclose(np.asarray(wide), [ref] * 8, rtol=1e-5)
