"""Newton-Schulz iterations and coefficient schedules, checked against float64 SVDs."""


import functools
import inspect
import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tf32_round

import spectral_optax as so

# private: a CPU host cannot show a GPU's behaviour through any public name; two seams simulate one (the
# iteration's matmul, patched to round its operands to TF32; the platform, patched to 'gpu'). Everything
# else is read through so / so.expert / so.diagnostics.
import spectral_optax._duals.polar.iteration as ns_iteration  # private: its matmul, patched to round to TF32
import spectral_optax._duals.polar.policy as ns_policy  # private: its platform, patched to "gpu"
from spectral_optax import newton_schulz
from spectral_optax.expert import (
    POWER3_COEFFICIENTS,
    POWER4_COEFFICIENTS,
    optimal_quintic,
    polar_express_coefficients,
)

# The 'power' start's constants as docs/math.md states them ("The 'power' start"): the estimate's
# safety factor, its start vectors, its power steps, and the guard's band top.
POWER_SAFETY, POWER_STARTS, POWER_ITERATIONS, POWER_GUARD = 1.05, 4, 8, 1.25

# Published 8-step Polar Express table (Amsel et al. 2025), before the safety factor.
PUBLISHED_PE = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]


def _compose(table, x):
    for a, b, c in table:
        x = a * x + b * x**3 + c * x**5
    return x


def _random_matrix(rng, m, n, cond):
    """float64 m x n matrix with log-spaced singular values from 1 down to 1/cond."""
    k = min(m, n)
    u, _ = np.linalg.qr(rng.normal(size=(m, k)))
    v, _ = np.linalg.qr(rng.normal(size=(n, k)))
    s = np.logspace(0, -math.log10(cond), k)
    return (u * s) @ v.T


def _singular_values_on_input_basis(g, y):
    """For G = U S V^T, the result's values d_i = u_i^T Y v_i and the residual
    ||U_k^T Y V_k - diag(d_k)||_2 over the singular directions k with
    s_k >= 1e-2 s_max (small when Y = U p(S) V^T there), all in float64."""
    u, s, vt = np.linalg.svd(g, full_matrices=False)
    proj = u.T @ y @ vt.T
    d = np.diag(proj)
    k = int(np.sum(s >= 1e-2 * s[0]))
    resid = np.linalg.norm(proj[:k, :k] - np.diag(d[:k]), ord=2)
    return s, d, resid


# ---------------------------------------------------------------- schedules
def test_polar_express_reproduces_published_table():
    table = polar_express_coefficients(8, safety=1.0)
    np.testing.assert_allclose(table[0], PUBLISHED_PE[0], rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.array(table), np.array(PUBLISHED_PE), rtol=0, atol=1e-8)


def test_polar_express_safety_divides_all_but_last():
    s = 1.01
    table = polar_express_coefficients(8)  # pinned default safety 1.01
    for k in range(7):
        a, b, c = PUBLISHED_PE[k]
        np.testing.assert_allclose(table[k], (a / s, b / s**3, c / s**5), rtol=1e-9)
    np.testing.assert_allclose(table[7], PUBLISHED_PE[7], atol=1e-8)


def test_polar_express_iteration_converges():
    x = np.logspace(-3, 0, 2001)  # the pinned interval [l, 1]
    err = [np.max(np.abs(_compose(polar_express_coefficients(k, safety=1.0), x) - 1)) for k in (4, 6, 8, 10)]
    assert err[2] < 1e-3 and err[3] < 1e-6
    assert all(b < a for a, b in itertools.pairwise(err))
    # With the safety factor the iteration still converges, now on [l, 1.01].
    y = _compose(polar_express_coefficients(10), np.logspace(-3, np.log10(1.01), 2001))
    assert np.max(np.abs(y - 1)) < 1e-3


def test_optimal_quintic_equioscillates():
    l, u = 0.05, 1.0
    a, b, c = optimal_quintic(l, u)
    x = np.linspace(l, u, 200001)
    e = 1 - (a * x + b * x**3 + c * x**5)
    emax = np.max(np.abs(e))
    # The error alternates +E, -E, +E, -E at l, two interior extrema, u.
    q, r = np.sqrt((-3 * b + np.array([-1, 1]) * math.sqrt(9 * b * b - 20 * a * c)) / (10 * c))
    vals = [1 - (a * t + b * t**3 + c * t**5) for t in (l, q, r, u)]
    np.testing.assert_allclose(np.abs(vals), emax, rtol=1e-6)
    assert vals[0] > 0 and vals[1] < 0 and vals[2] > 0 and vals[3] < 0
    # ... and it beats any perturbation of itself (minimax).
    for da in (1e-3, -1e-3):
        assert np.max(np.abs(1 - ((a + da) * x + b * x**3 + c * x**5))) > emax


def test_schedule_validation():
    with pytest.raises(ValueError, match="num_steps"):
        polar_express_coefficients(0)
    with pytest.raises(ValueError, match="safety"):
        polar_express_coefficients(8, safety=0.9)
    x = jnp.ones((4, 6))
    with pytest.raises(ValueError, match="unknown coefficients"):
        newton_schulz(x, "cubic")
    with pytest.raises(ValueError, match="shape"):
        newton_schulz(x, [(1.0, 2.0)])
    with pytest.raises(ValueError, match="fewer than"):
        newton_schulz(x, so.expert.polar_express_coefficients(8), steps=5)
    with pytest.raises(ValueError, match=r"\(\.\.\., m, n\)"):
        newton_schulz(jnp.ones(5))
    with pytest.raises(ValueError, match="method"):
        newton_schulz(x, method="svd")


# ------------------------------------------------------------------ quality
SHAPES = [(48, 48), (32, 96), (96, 32)]
CONDS = [1.0, 10.0, 1e2, 1e3, 1e4]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quintic_singular_values_in_range(shape, dtype):
    rng = np.random.default_rng(0)
    for cond in CONDS:
        g = _random_matrix(rng, *shape, cond)
        y = newton_schulz(jnp.asarray(g, dtype), "quintic", compute_dtype=dtype)
        assert y.dtype == jnp.dtype(dtype)
        s, d, resid = _singular_values_on_input_basis(g, np.asarray(y.astype(jnp.float32), np.float64))
        keep = s >= 1e-2 * s[0]
        assert np.all((d[keep] >= 0.6) & (d[keep] <= 1.25)), (cond, d[keep].min(), d[keep].max())
        # The result is U p(S) V^T: no mixing of singular directions beyond rounding.
        assert resid < (0.02 if dtype == "float32" else 0.1), resid


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", ["standard", "gram"])
def test_polar_express_8_steps_within_1_percent_f32(shape, method):
    rng = np.random.default_rng(1)
    for cond in CONDS:
        g = _random_matrix(rng, *shape, cond)
        y = newton_schulz(jnp.asarray(g, jnp.float32), "polar_express", steps=8, method=method,
                          compute_dtype=jnp.float32)
        s, d, resid = _singular_values_on_input_basis(g, np.asarray(y, np.float64))
        keep = s >= 1e-2 * s[0]
        assert np.max(np.abs(d[keep] - 1)) < 0.01, (cond, d[keep].min(), d[keep].max())
        # No singular value of the result itself (SVD of Y), even from the tiny
        # directions outside the guarantee, overshoots by more than 3%.
        assert np.linalg.svd(np.asarray(y, np.float64), compute_uv=False).max() < 1.03
        assert resid < 0.01


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (24, 120)])
def test_gram_variant_matches_standard_f32(shape):
    # Entrywise agreement for moderately conditioned inputs (for cond 1e4 the
    # directions below the interval carry amplified round-off in both; the
    # quality tests above cover them through the SVD).
    rng = np.random.default_rng(2)
    for cond in (1.0, 10.0, 1e2):
        g = jnp.asarray(_random_matrix(rng, *shape, cond), jnp.float32)
        for coef in ("quintic", "polar_express"):
            a = newton_schulz(g, coef, method="standard", compute_dtype=jnp.float32)
            b = newton_schulz(g, coef, method="gram", compute_dtype=jnp.float32)
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-4)


def test_auto_method_picks_gram_only_when_cheaper_and_accurate():
    assert so.expert.newton_schulz_method(768, 3072, 5, jnp.float32) == "gram"
    assert so.expert.newton_schulz_method(3072, 768, 5, jnp.float32) == "gram"
    assert so.expert.newton_schulz_method(768, 768, 5, jnp.float32) == "standard"
    # float16: with one restart (4 steps: 52 / 72 of the standard flops), not at 5 steps (70 / 90).
    assert so.expert.newton_schulz_method(768, 3072, 4, jnp.float16) == "gram"
    assert so.expert.newton_schulz_method(768, 3072, 5, jnp.float16) == "standard"
    # ... nor for long schedules (Polar Express 8: measured 0.84 on real gradients in float16).
    assert so.expert.newton_schulz_method(768, 50304, 8, jnp.float16) == "standard"
    assert so.expert.newton_schulz_method(768, 50304, 5, jnp.float16) == "gram"
    # bfloat16: the restarts it needs leave < 25% to save.
    for steps in (4, 5, 8):
        assert so.expert.newton_schulz_method(768, 3072, steps, jnp.bfloat16) == "standard"
        assert so.expert.newton_schulz_method(768, 50304, steps, jnp.bfloat16) == "standard"


@pytest.mark.parametrize(
    "precision, gram",
    [
        (None, True),  # float32 compute -> Precision.HIGHEST -> Gram-space is safe
        ("highest", True),
        (jax.lax.Precision.HIGHEST, True),
        ((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST), True),
        ("tensorfloat32", False),  # the GPU's float32 default: 10 mantissa bits
        (jax.lax.Precision.HIGH, False),
        (jax.lax.Precision.DEFAULT, False),  # TF32 on a GPU, one bf16 pass on a TPU
        ("bfloat16", False),
        ((jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT), False),
    ],
)
def test_auto_method_is_precision_aware(precision, gram):
    m, n = 768, 3072
    assert so.expert.newton_schulz_method(m, n, 5, jnp.float32, "auto", precision) == ("gram" if gram else "standard")
    # bfloat16 compute never gets the Gram-space variant, whatever the precision.
    assert so.expert.newton_schulz_method(m, n, 5, jnp.bfloat16, "auto", precision) == "standard"


def _dot_generals(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]


def _is_highest(p):
    h = jax.lax.Precision.HIGHEST
    return p == h or (isinstance(p, tuple) and all(q == h for q in p))


@pytest.mark.parametrize("shape", [(16, 64), (40, 40)])
def test_float32_iteration_runs_at_highest_precision_even_under_a_lower_default(shape):
    # A GPU runs float32 matmuls at TF32 unless told otherwise; on a CPU the
    # precision flag changes nothing, so check what the iteration asks for.
    x = jnp.ones((2, *shape), jnp.float32)
    with jax.default_matmul_precision("bfloat16"):
        eqns = _dot_generals(lambda x: newton_schulz(x, compute_dtype=jnp.float32), x)
        steps = 5
        gram = so.expert.newton_schulz_method(*shape, steps, jnp.float32) == "gram"
        # Gram-space: X X^T, then R^2 and Q P per step, P R P but the last, Q X; standard: 3 per step.
        assert len(eqns) == (4 * steps - 1 if gram else 3 * steps)
        assert all(_is_highest(e.params["precision"]) for e in eqns)
        # An explicit lower precision is honoured, and then the iteration is the standard one.
        eqns = _dot_generals(lambda x: newton_schulz(x, compute_dtype=jnp.float32, precision="tensorfloat32"), x)
        assert len(eqns) == 3 * steps
        assert all(not _is_highest(e.params["precision"]) for e in eqns)
    # bfloat16 compute keeps the backend default (fast tensor-core products).
    eqns = _dot_generals(lambda x: newton_schulz(x, "quintic", compute_dtype=jnp.bfloat16), x)
    assert len(eqns) == 3 * steps
    assert all(e.params["precision"] is None and e.invars[0].aval.dtype == jnp.bfloat16 for e in eqns)


def _emulated_gpu_dot(orig):
    """``iteration._dot`` as a GPU computes it: TF32 operands unless Precision.HIGHEST."""

    def dot(x, y, cx, cy, precision):
        if x.dtype == jnp.float32 and not _is_highest(precision):
            x, y = tf32_round(x), tf32_round(y)
        return orig(x, y, cx, cy, precision)

    return dot


def test_emulated_tf32_gram_fails_and_defaults_hold(monkeypatch):
    """The H200 failure, reproduced on a CPU: at TF32 the Gram-space Polar
    Express iteration without restarts leaves the 0.02 band around 1 (or
    overflows); its default restarts at TF32 (every 2 steps) and the defaults
    (float32 at HIGHEST, 'auto') keep it within 1e-3 even there."""
    monkeypatch.setattr(ns_iteration, "_dot", _emulated_gpu_dot(ns_iteration._dot))
    rng = np.random.default_rng(1)
    for shape in [(32, 96), (96, 32)]:
        g = _random_matrix(rng, *shape, 1e2)
        xg = jnp.asarray(g, jnp.float32)
        bad = np.asarray(newton_schulz(xg, "polar_express", steps=8, method="gram", compute_dtype=jnp.float32,
                                       precision="tensorfloat32", restarts=()), np.float64)
        if np.all(np.isfinite(bad)):  # the emulation must reproduce the failure
            s, d, _ = _singular_values_on_input_basis(g, bad)
            assert np.max(np.abs(d[s >= 1e-2 * s[0]] - 1)) > 0.02
        for precision, method in ((None, "auto"), ("tensorfloat32", "auto"), ("tensorfloat32", "gram")):
            # auto: gram at HIGHEST, standard at TF32; gram at TF32 restarts every 2 steps.
            y = np.asarray(newton_schulz(xg, "polar_express", steps=8, compute_dtype=jnp.float32,
                                         precision=precision, method=method), np.float64)
            s, d, _ = _singular_values_on_input_basis(g, y)
            assert np.max(np.abs(d[s >= 1e-2 * s[0]] - 1)) < 1e-3, (shape, precision)


def test_simulated_gpu_defaults_and_user_function_dtype(monkeypatch):
    monkeypatch.setattr(ns_policy, "_platform", lambda: "gpu")
    rng = np.random.default_rng(6)
    g = rng.normal(size=(3, 10, 20))
    seen = {}

    def exact_polar(x):  # jnp.linalg.svd rejects bfloat16: this raised on a GPU
        seen["dtype"] = x.dtype
        seen["precision"] = jax.config.jax_default_matmul_precision
        u, _, vt = jnp.linalg.svd(x, full_matrices=False)
        return u @ vt

    y = newton_schulz(jnp.asarray(g, jnp.float32), exact_polar)  # default compute dtype: bf16 here
    assert seen == {"dtype": jnp.float32, "precision": "highest"}
    assert y.dtype == jnp.float32
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    np.testing.assert_allclose(np.asarray(y, np.float64), u @ vt, atol=1e-5)
    # The default iteration on the simulated GPU: bfloat16, 'power4' by shape. Aspect 4 (16 x 64): the
    # 'power' start (its Gram matrix and that matrix's square), the first step in X space (1), then
    # Gram space for 3 steps: the Gram matrix, 3 squares, 2 products into Q, 2 x 2 for the Gram
    # updates, Q X: 14 bfloat16 products; and the estimate's 8 float32 products of B^2 with the 4
    # starts side by side.
    eqns = _dot_generals(lambda x: newton_schulz(x), jnp.ones((2, 16, 64), jnp.float32))
    half = [e for e in eqns if e.invars[0].aval.dtype == jnp.bfloat16]
    power = [e for e in eqns if e.invars[0].aval.dtype == jnp.float32]
    assert len(half) == 14 and len(power) == POWER_ITERATIONS == 8 and len(eqns) == 22
    assert all(e.invars[1].aval.shape[-1] == POWER_STARTS == 4 for e in power)
    # Near-square (16 x 24): the standard iteration from the same start, 2 + 1 + 3 * 3 products.
    eqns = _dot_generals(lambda x: newton_schulz(x), jnp.ones((2, 16, 24), jnp.float32))
    assert sum(e.invars[0].aval.dtype == jnp.bfloat16 for e in eqns) == 12
    # A bfloat16 input reaches the user function as float32 and comes back as bfloat16.
    yb = newton_schulz(jnp.asarray(g, jnp.bfloat16), exact_polar)
    assert seen["dtype"] == jnp.float32 and yb.dtype == jnp.bfloat16


# ---------------------------------------------------------------- numerics
@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_gives_zero_and_scale_invariance(method, dtype):
    rng = np.random.default_rng(3)
    g = rng.normal(size=(16, 40))
    x = jnp.stack([jnp.zeros((16, 40)), jnp.asarray(g)]).astype(dtype)
    y = newton_schulz(x, method=method, compute_dtype=jnp.float32)
    assert y.dtype == jnp.dtype(dtype)
    assert np.all(np.asarray(y[0]) == 0)
    assert np.all(np.isfinite(np.asarray(y.astype(jnp.float32))))
    if dtype == "float32":
        for factor in (1e30, 1e-30):
            z = newton_schulz(jnp.asarray(g * factor, jnp.float32), method=method, compute_dtype=jnp.float32)
            assert np.all(np.isfinite(np.asarray(z)))
            np.testing.assert_allclose(np.asarray(z), np.asarray(y[1]), atol=1e-5)


def test_batched_equals_loop_and_transpose_symmetry():
    # float32 compute (the CPU default; GPUs/TPUs default to bfloat16, whose
    # round-off differs between the wide and tall orientations).
    ns = functools.partial(newton_schulz, compute_dtype=jnp.float32)
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, 3, 12, 30)), jnp.float32)
    for method in ("standard", "gram"):
        y = ns(x, method=method)
        assert y.shape == x.shape
        for i in range(2):
            for j in range(3):
                np.testing.assert_allclose(
                    np.asarray(y[i, j]), np.asarray(ns(x[i, j], method=method)), atol=1e-5
                )
        # NS(X^T) = NS(X)^T: the tall orientation is the same map.
        yt = ns(jnp.swapaxes(x, -1, -2), method=method)
        np.testing.assert_allclose(np.asarray(yt), np.asarray(jnp.swapaxes(y, -1, -2)), atol=1e-5)


def test_user_table_and_user_function():
    rng = np.random.default_rng(5)
    g = jnp.asarray(rng.normal(size=(10, 20)), jnp.float32)
    np.testing.assert_allclose(
        np.asarray(newton_schulz(g, [so.expert.MUON_QUINTIC] * 5)), np.asarray(newton_schulz(g, "quintic")), atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(newton_schulz(g, so.expert.MUON_QUINTIC, steps=5)), np.asarray(newton_schulz(g)), atol=1e-6
    )
    # A short table is extended with its last row.
    table = [(2.0, -1.5, 0.5), (1.875, -1.25, 0.375)]
    np.testing.assert_allclose(
        np.asarray(newton_schulz(g, table, steps=4)),
        np.asarray(newton_schulz(g, table + [table[-1]] * 2)),
        atol=1e-6,
    )

    def exact_polar(x):
        u, _, vt = jnp.linalg.svd(x, full_matrices=False)
        return u @ vt

    y = np.asarray(newton_schulz(g, exact_polar), np.float64)
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    np.testing.assert_allclose(y, u @ vt, atol=1e-5)


def test_jit_and_flops_formula():
    x = jnp.ones((3, 8, 24))
    y = jax.jit(lambda x: newton_schulz(x, "polar_express", steps=5))(x)
    assert y.shape == x.shape and np.all(np.isfinite(np.asarray(y)))
    m, n, k = 768, 3072, 5
    assert so.expert.newton_schulz_flops(m, n, k) == k * (4 * m * m * n + 2 * m**3)
    assert so.expert.newton_schulz_flops(n, m, k, "gram") == 4 * m * m * n + 2 * m**3 * (4 * k - 3)


# ------------------------------------------- coefficient sets, preconditioning, restarts
# You's 5-step set as published (Dion's zeropower_via_newtonschulz5; optax's 'dion').
PUBLISHED_YOU = [
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
]


def test_you_coefficients_and_first_n_convention():
    for name in ("you", "dion"):
        table, safety = so.expert.resolve_coefficients(name)
        np.testing.assert_array_equal(np.array(table), np.array(PUBLISHED_YOU))
        assert safety == 1.0
    # Fewer steps: the first rows (the published Polar Express code's coeffs_list[:steps]); more:
    # the last row repeated.
    assert so.expert.resolve_coefficients("you", 3)[0] == tuple(PUBLISHED_YOU[:3])
    assert so.expert.resolve_coefficients("you", 7)[0] == tuple(PUBLISHED_YOU + [PUBLISHED_YOU[-1]] * 2)
    # Polar Express: the N-step table is the published 8-step one's first N rows, with the safety
    # factor 1.01 on all of them but the last (which the published code divides too).
    s = 1.01
    for n in (3, 5):
        table = polar_express_coefficients(n)
        for k in range(n - 1):
            a, b, c = PUBLISHED_PE[k]
            np.testing.assert_allclose(table[k], (a / s, b / s**3, c / s**5), rtol=1e-9)
        np.testing.assert_allclose(table[n - 1], PUBLISHED_PE[n - 1], rtol=1e-9)


def _ns_reference(g, table, preconditioning="frobenius", safety=1.0):
    """float64 NumPy reference: normalize, precondition, iterate (wide orientation)."""
    x = np.asarray(g, np.float64)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / np.linalg.norm(x)
    a_ = x @ x.T
    if preconditioning == "schatten":
        x = x / np.sqrt(np.linalg.norm(a_))
    elif preconditioning == "aol":
        x = x / np.sqrt(np.abs(a_).sum(axis=1))[:, None]
    x = x / safety
    for a, b, c in table:
        s_ = x @ x.T
        x = a * x + (b * s_ + c * s_ @ s_) @ x
    return x.T if tall else x


@pytest.mark.parametrize("preconditioning", ["frobenius", "schatten", "aol"])
@pytest.mark.parametrize("method", ["standard", "gram"])
def test_preconditioning_matches_float64_reference(preconditioning, method):
    rng = np.random.default_rng(7)
    for shape in [(24, 72), (72, 24)]:
        for cond in (1.0, 1e2):
            g = _random_matrix(rng, *shape, cond) * rng.uniform(0.1, 10)
            for coef, steps in (("quintic", 5), ("polar_express_schatten", 4)):
                table, safety = so.expert.resolve_coefficients(coef, steps)
                y = newton_schulz(jnp.asarray(g, jnp.float32), coef, steps=steps, compute_dtype=jnp.float32,
                                  method=method, preconditioning=preconditioning)
                ref = _ns_reference(g, table, preconditioning, safety)
                np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=0, atol=5e-4,
                                           err_msg=f"{shape} {cond} {coef}")


def test_schatten_and_aol_starts_are_bounded_by_one():
    # sigma_max <= ||X||_S4 = ||X X^T||_F^(1/2) <= ||X||_F, and ||D X||_2 <= 1 for D the inverse
    # square roots of the row sums of |X X^T| (the AOL lemma), in float64.
    rng = np.random.default_rng(8)
    for _ in range(20):
        x = rng.normal(size=(16, 40)) * np.exp(rng.normal(size=(16, 1)))
        a = x @ x.T
        s = np.linalg.svd(x, compute_uv=False)
        assert s[0] <= np.sqrt(np.linalg.norm(a)) * (1 + 1e-12) <= np.linalg.norm(x) * (1 + 1e-12)
        d = 1 / np.sqrt(np.abs(a).sum(axis=1))
        assert np.linalg.svd(d[:, None] * x, compute_uv=False)[0] <= 1 + 1e-12


def test_default_preconditioning_and_auto_coefficients():
    assert so.expert.auto_schedule(16, 64, jnp.float32)[0] == so.expert.auto_schedule(40, 40, jnp.float32)[0] == "quintic"
    # bfloat16: 'power4' by shape (power4_schedule); float16: 'polar_express_schatten'
    assert so.expert.auto_schedule(16, 64, jnp.bfloat16) == so.expert.auto_schedule(64, 16, jnp.bfloat16) == (
        "power4", "gram", (1,))
    assert so.expert.auto_schedule(16, 31, jnp.bfloat16) == ("power4", "standard", ())
    assert so.expert.auto_schedule(16, 64, jnp.float16) == ("polar_express_schatten", "auto", None)
    assert so.expert.auto_schedule(16, 32, jnp.float16)[0] == "polar_express_schatten"
    assert so.expert.power4_schedule(16, 64) == so.expert.power4_schedule(64, 16) == ("power4", "gram", (1,))
    assert so.expert.power4_schedule(16, 31) == ("power4", "standard", ())
    assert so.expert.default_preconditioning("polar_express_schatten") == "schatten"
    assert so.expert.default_preconditioning("power4") == so.expert.default_preconditioning("power3") == "power"
    assert so.expert.default_preconditioning("quintic") == so.expert.default_preconditioning(so.expert.MUON_QUINTIC) == "frobenius"
    rng = np.random.default_rng(9)
    cases = [(jnp.float32, (2, 16, 40), "quintic", {}), (jnp.bfloat16, (2, 16, 40), "power4", {"method": "gram",
             "restarts": (1,)}), (jnp.bfloat16, (2, 24, 40), "power4", {"method": "standard"}),
             (jnp.float16, (2, 40, 16), "polar_express_schatten", {})]
    for dtype, shape, coef, kw in cases:
        g = jnp.asarray(rng.normal(size=shape), jnp.float32)
        auto = newton_schulz(g, compute_dtype=dtype)
        explicit = newton_schulz(g, coef, compute_dtype=dtype, preconditioning=so.expert.default_preconditioning(coef),
                                 **kw)
        np.testing.assert_array_equal(np.asarray(auto), np.asarray(explicit))
    table = so.expert.resolve_coefficients("polar_express_schatten")[0]
    assert len(table) == 4
    np.testing.assert_allclose(table, polar_express_coefficients(4, l=3e-3), rtol=0)


@pytest.mark.parametrize("restarts", [(2,), (1, 3), (1, 2, 3)])
def test_gram_restarts_match_standard_f32_and_dot_count(restarts):
    rng = np.random.default_rng(10)
    g = jnp.asarray(_random_matrix(rng, 24, 96, 10.0), jnp.float32)
    for prec in ("frobenius", "schatten"):
        a = newton_schulz(g, "polar_express_schatten", compute_dtype=jnp.float32, method="standard",
                          preconditioning=prec)
        b = newton_schulz(g, "polar_express_schatten", compute_dtype=jnp.float32, method="gram",
                          preconditioning=prec, restarts=restarts)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-4)
    # Every segment of k steps: its Gram matrix, k squares, k - 1 products into Q, 2 (k - 1) for R,
    # one application to X: 4 K - j products for j segments (the flop model's count).
    eqns = _dot_generals(lambda x: newton_schulz(x, "quintic", steps=4, compute_dtype=jnp.float32, method="gram",
                                                 restarts=restarts), g)
    j = 1 + len(restarts)
    assert len(eqns) == 4 * 4 - j
    m, n = 24, 96
    flops = sum(2 * math.prod(e.invars[0].aval.shape[1:]) * e.outvars[0].aval.shape[-1]
                if e.params["dimension_numbers"][0][0] != (1,) else
                2 * math.prod(e.invars[0].aval.shape[1:]) * e.invars[1].aval.shape[-1]
                for e in eqns)
    assert flops == so.expert.newton_schulz_flops(m, n, 4, "gram", restarts=restarts)


def test_restart_schedules_by_precision():
    assert so.expert.gram_restarts(5, jnp.float32) == ()
    assert so.expert.gram_restarts(5, jnp.float32, "tensorfloat32") == (2, 4)
    assert so.expert.gram_restarts(4, jnp.float16) == (2,)
    assert so.expert.gram_restarts(5, jnp.bfloat16) == (1, 2, 3)
    assert so.expert.gram_restarts(5, jnp.bfloat16, restarts=[3, 1]) == (1, 3)
    with pytest.raises(ValueError, match="restarts"):
        so.expert.gram_restarts(4, jnp.float16, restarts=[4])
    with pytest.raises(ValueError, match="preconditioning"):
        newton_schulz(jnp.ones((4, 6)), preconditioning="spectral")
    m, n, k = 768, 3072, 4
    assert so.expert.newton_schulz_flops(m, n, k, "gram", restarts=(2,)) == 2 * 4 * m * m * n + 2 * m**3 * (4 * k - 6)


# Singular values on the input's directions (s >= 1e-2 s_max) of the half-precision defaults.
# Measured over seeds 0-4 (default ISA and XLA_FLAGS=--xla_cpu_max_isa=AVX2 gave the same figures):
# bf16 standard [0.735, 1.222] (mixing 0.22), float16 gram with a restart at 2 [0.785, 1.208] (0.09),
# float32 ('auto': the quintic) [0.682, 1.147]; the 4-step table's own range on [3e-3, 1] is
# [0.774, 1.207].
@pytest.mark.parametrize("dtype, method", [("bfloat16", "standard"), ("float16", "gram"), ("float32", "gram")])
def test_half_precision_defaults_hold_the_quintic_band(dtype, method):
    rng = np.random.default_rng(11)
    for shape in [(48, 48), (32, 128), (128, 32)]:
        mats = [_random_matrix(rng, *shape, cond) for cond in (1.0, 1e2, 1e4)] + [rng.normal(size=shape)]
        for g in mats:
            if method == "gram" and shape[0] == shape[1]:
                continue
            y = newton_schulz(jnp.asarray(g, jnp.float32), compute_dtype=dtype, method=method)
            s, d, resid = _singular_values_on_input_basis(g, np.asarray(y, np.float64))
            keep = s >= 1e-2 * s[0]
            assert np.all((d[keep] >= 0.6) & (d[keep] <= 1.25)), (shape, d[keep].min(), d[keep].max())
            assert resid < 0.3, resid


@pytest.mark.parametrize("preconditioning", ["schatten", "aol", "power"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_preconditioned_zero_and_extreme_scales_stay_finite(preconditioning, dtype):
    rng = np.random.default_rng(12)
    g = rng.normal(size=(16, 40))
    g[3] = 0.0  # a zero row: AOL's row sum is 0 there
    for factor in (1e-30, 1.0, 1e30):
        x = jnp.stack([jnp.zeros((16, 40)), jnp.asarray(g * factor)]).astype(jnp.float32)
        y = np.asarray(newton_schulz(x, compute_dtype=dtype, preconditioning=preconditioning, method="gram"))
        assert np.all(y[0] == 0) and np.all(np.isfinite(y))
        assert np.all(y[1, 3] == 0)


# ----------------------------------------------------------------- 'power' start, 'power3'
def test_power3_table_range_float64():
    # The table's design claim, in float64: [1e-2 / POWER_SAFETY, 1.03] -> [0.638, 1.176].
    l = 1e-2 / POWER_SAFETY
    y = _compose(so.expert.POWER3_COEFFICIENTS, np.concatenate([np.geomspace(l, 1, 20001), np.linspace(1, 1.03, 301)]))
    assert 0.6378 <= y.min() and y.max() <= 1.1759, (y.min(), y.max())
    assert so.expert.resolve_coefficients("power3") == (so.expert.POWER3_COEFFICIENTS, 1.0)
    assert so.expert.default_preconditioning("power3") == "power"


@pytest.mark.parametrize("method", ["standard", "gram"])
def test_power_start_normalizes_by_the_estimate_float64_reference(method):
    # Spectra whose top is separated (ratio 0.5: 10 power steps on A^2 give sigma_max to ~1e-12), so
    # the normalization is min(||G||_S8, POWER_SAFETY sigma_max), known in float64: the result must be
    # U p(S / N) V^T with p the composed 'power3' polynomial.
    rng = np.random.default_rng(13)
    for shape, top in (((24, 72), [1.0]), ((72, 24), [1.0, 1.0]), ((48, 48), [1.0, 1.0, 1.0])):
        k = min(shape)
        u, _ = np.linalg.qr(rng.normal(size=(shape[0], k)))
        v, _ = np.linalg.qr(rng.normal(size=(shape[1], k)))
        s = np.concatenate([top, np.logspace(np.log10(0.5), -2, k - len(top))])
        g = (u * s) @ v.T * 37.0
        n_ref = min(np.sum(s**8) ** 0.125, POWER_SAFETY * s[0])
        want = _compose(so.expert.POWER3_COEFFICIENTS, s / n_ref)
        y = np.asarray(newton_schulz(jnp.asarray(g, jnp.float32), "power3", compute_dtype=jnp.float32,
                                     method=method), np.float64)
        np.testing.assert_allclose(u.T @ y @ v, np.diag(want), atol=3e-4, err_msg=str(shape))


def test_power_start_holds_its_band_f32_and_counts_matvecs():
    # Gaussian (no spectral gap: the estimate's worst case), conditioned and rank-deficient matrices;
    # float32 at HIGHEST: the table's own range [0.638, 1.176] up to round-off (measured over seeds 0-4:
    # [0.63786, 1.17580], mixing < 1e-4; default ISA and XLA_FLAGS=--xla_cpu_max_isa=AVX2 alike).
    rng = np.random.default_rng(14)
    mats = [rng.normal(size=(96, 96)), rng.normal(size=(32, 128)), _random_matrix(rng, 128, 32, 1e4),
            rng.normal(size=(64, 3)) @ rng.normal(size=(3, 64))]
    for g in mats:
        y = newton_schulz(jnp.asarray(g, jnp.float32), "power3", compute_dtype=jnp.float32)
        s, d, resid = _singular_values_on_input_basis(g, np.asarray(y, np.float64))
        keep = s >= 1e-2 * s[0]
        assert 0.636 <= d[keep].min() and d[keep].max() <= 1.178, (g.shape, d[keep].min(), d[keep].max())
        assert resid < 5e-3
    m, n = 768, 3072
    assert so.expert.newton_schulz_flops(m, n, 3, preconditioning="power") == (
        so.expert.newton_schulz_flops(m, n, 3) + 8 * 4 * 2 * m * m)  # 8 iterations x 4 starts


# ----------------------------------------------------------------- 'power4', the half-precision default
def _top_orthogonal_to(vectors, rng, k, n, ratio):
    """A ``k x n`` matrix (k <= n) whose top left singular vector is orthogonal to ``vectors`` (k x p)
    and whose second singular value is ``ratio`` times the first: the power estimate's blind spot."""
    q, _ = np.linalg.qr(np.concatenate([vectors, rng.normal(size=(k, k - vectors.shape[1]))], axis=1))
    u = np.concatenate([q[:, -1:], q[:, :-1]], axis=1)  # u_1 is the last column: orthogonal to the starts
    v, _ = np.linalg.qr(rng.normal(size=(n, k)))
    s = np.concatenate([[1.0], ratio * np.geomspace(1.0, 0.05, k - 1)])
    return (u * s) @ v.T


def test_power_start_covers_a_top_direction_one_start_misses():
    # The failure a single start had in a bfloat16 GPT run (overlap 1.2e-4 with the top eigenvector:
    # sigma_1(X_0) = 1.107, then 152 after two 'power4' steps): here the top left singular vector is
    # exactly orthogonal to three of the four starts (drawn as the code documents: key 0, (k, 4),
    # columns normalized), with a gap (0.75) that leaves a missed top unfound in 8 steps. The fourth
    # start must find it: the result in the band against the float64 SVD, in float32.
    rng = np.random.default_rng(21)
    k, n = 48, 144
    starts = np.asarray(jax.random.normal(jax.random.key(0), (k, POWER_STARTS), jnp.float32), np.float64)
    g = _top_orthogonal_to(starts[:, :3], rng, k, n, 0.75)
    y = np.asarray(newton_schulz(jnp.asarray(g, jnp.float32), "power4", compute_dtype=jnp.float32), np.float64)
    s, d, _ = _singular_values_on_input_basis(g, y)
    keep = s >= 1e-2 * s[0]
    assert 0.93 <= d[keep].min() and d[keep].max() <= 1.03, (d[keep].min(), d[keep].max())


def test_power_start_guard_returns_the_start_when_every_start_misses():
    # The top direction orthogonal to all four starts: in float32 the estimate finds only the second
    # value (0.75 of the first), sigma_1(X_0) = 1.27 > 1.03 and the steep table leaves the band (its
    # values grow past 1e3). The guard must return X_0 = G / N instead: finite, in G's direction
    # (measured: d_1 = 1.27, the others s_i / N), with ||X_0||_F^2 <= POWER_GUARD^2 min(m, n); without
    # the guard this test sees a blown-up result. (In bfloat16 the rounding of B^2 gives the starts a
    # component along the top and the estimate finds it: d in [0.958, 1.019].)
    dtype = jnp.float32
    rng = np.random.default_rng(22)
    k, n = 48, 144
    starts = np.asarray(jax.random.normal(jax.random.key(0), (k, POWER_STARTS), jnp.float32), np.float64)
    g = _top_orthogonal_to(starts, rng, k, n, 0.75)
    for x in (g, g.T):  # the tall one runs on its transpose's Gram side
        y = np.asarray(newton_schulz(jnp.asarray(x, jnp.float32), "power4", compute_dtype=dtype), np.float64)
        assert np.all(np.isfinite(y))
        cos = np.sum(y * x) / (np.linalg.norm(y) * np.linalg.norm(x))
        assert cos > 0.999, cos
        assert np.linalg.norm(y) ** 2 <= POWER_GUARD**2 * k
    # a matrix the estimate does not miss is not touched by the guard (batched with the missed one)
    h = rng.normal(size=(k, n))
    y = np.asarray(newton_schulz(jnp.asarray(np.stack([g, h]), jnp.float32), "power4", compute_dtype=jnp.float32))
    s, d, _ = _singular_values_on_input_basis(h, np.asarray(y[1], np.float64))
    assert 0.93 <= d[s >= 1e-2 * s[0]].min()


def test_power4_table_range_float64():
    # The table's design claim, in float64: [1e-2 / POWER_SAFETY, 1.03] -> [0.938, 1.027].
    l = 1e-2 / POWER_SAFETY
    y = _compose(so.expert.POWER4_COEFFICIENTS, np.concatenate([np.geomspace(l, 1, 20001), np.linspace(1, 1.03, 301)]))
    assert 0.9382 <= y.min() and y.max() <= 1.0269, (y.min(), y.max())
    assert so.expert.resolve_coefficients("power4") == (so.expert.POWER4_COEFFICIENTS, 1.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_power4_schedule_holds_its_band_against_float64_svd(dtype):
    # The measured 'power4' candidate (power4_schedule: Gram space with one restart on aspect >= 2,
    # standard otherwise) on Gaussian (both orientations), conditioned and
    # rank-3 matrices: the values d_i = u_i^T NS(G) v_i for s_i >= 1e-2 s_1 (float64 SVD). Measured with
    # these matrices for seeds 15-19 (default ISA and XLA_FLAGS=--xla_cpu_max_isa=AVX2 alike): bfloat16
    # [0.9367, 1.0475], float16 [0.9384, 1.0282]; the thresholds leave 0.036. A zero matrix stays zero,
    # scales 1e-30 / 1e30 give the same result.
    rng = np.random.default_rng(15)
    mats = [rng.normal(size=(64, 256)), rng.normal(size=(256, 64)), rng.normal(size=(128, 128)),
            _random_matrix(rng, 64, 256, 1e4), _random_matrix(rng, 128, 128, 1e2),
            rng.normal(size=(128, 3)) @ rng.normal(size=(3, 128))]
    def run(x):
        coef, method, restarts = so.expert.power4_schedule(*x.shape[-2:])
        return newton_schulz(x, coef, compute_dtype=dtype, method=method, restarts=restarts)

    f = jax.jit(run)
    for g in mats:
        y = f(jnp.asarray(g, jnp.float32))
        s, d, _ = _singular_values_on_input_basis(g, np.asarray(y, np.float64))
        keep = s >= 1e-2 * s[0]
        assert 0.90 <= d[keep].min() and d[keep].max() <= 1.084, (g.shape, d[keep].min(), d[keep].max())
    g = mats[0]
    for factor in (1e-30, 1e30):
        x = jnp.stack([jnp.zeros(g.shape), jnp.asarray(g * factor)]).astype(jnp.float32)
        y = np.asarray(f(x))
        assert np.all(y[0] == 0) and np.all(np.isfinite(y))
        np.testing.assert_allclose(y[1], np.asarray(f(jnp.asarray(g, jnp.float32))), atol=2e-2)


def _polar_reference(g, steps, start="frobenius"):
    """float64: ``U p^steps(S / N) V^T`` for the Muon quintic ``p``; ``N`` the Frobenius or Schatten-4 norm."""
    u, s, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    x = s / (np.sqrt(np.sum(s**2)) if start == "frobenius" else np.sum(s**4) ** 0.25)
    for _ in range(steps):
        x = QUINTIC[0] * x + QUINTIC[1] * x**3 + QUINTIC[2] * x**5
    return (u * x) @ vt


QUINTIC = (3.4445, -4.7750, 2.0315)


def _split_newton_schulz(blocks, sharded_axis, **kw):
    """``newton_schulz`` on the blocks of one matrix, the split axis emulated by ``vmap`` with an axis name."""
    fn = lambda b: newton_schulz(b, "quintic", axis_name="d", sharded_axis=sharded_axis, **kw)
    return np.asarray(jax.vmap(fn, axis_name="d")(jnp.asarray(blocks, jnp.float32)))


def _dot_precisions(jaxpr):
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        for sub in jax.core.jaxprs_in_params(eqn.params):
            out.extend(_dot_precisions(sub))
    return out


def _max_error(abc, lo, hi, n=201):
    """``max |1 - p(x)|`` over ``n`` points of ``[lo, hi]``, in exact rational arithmetic."""
    a, b, c = (Fraction(v) for v in abc)
    lo, hi = Fraction(float(lo)), Fraction(float(hi))
    xs = (lo + (hi - lo) * Fraction(i, n - 1) for i in range(n))
    return float(max(abs(1 - (a * x + b * x**3 + c * x**5)) for x in xs))


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("preconditioning", ["frobenius", "schatten"])
def test_column_split_tall_matrix_matches_float64_polar_reference(preconditioning):
    """A tall matrix split along its columns (blocks narrower than the Gram matrix) equals the float64
    reference: the Gram matrix contracts the split axis and is summed over the blocks, also in the start."""
    g = np.random.default_rng(0).standard_normal((6, 4))
    y = _split_newton_schulz(np.stack([g[:, :2], g[:, 2:]]), -1, preconditioning=preconditioning)
    np.testing.assert_allclose(np.concatenate(list(y), axis=1), _polar_reference(g, 5, preconditioning), atol=2e-5)


@pytest.mark.usefixtures("highest_precision")
def test_row_split_accepts_positive_axis_and_rejects_out_of_range():
    """``sharded_axis=x.ndim - 2`` means rows (split rows match the float64 reference); an axis that is
    neither rows nor columns is rejected with a message naming the choices."""
    g = np.random.default_rng(1).standard_normal((4, 6))
    y = _split_newton_schulz(np.stack([g[:2], g[2:]]), 0)  # each block is 2-D: axis 0 is its rows
    np.testing.assert_allclose(np.concatenate(list(y), axis=0), _polar_reference(g, 5), atol=2e-5)
    with pytest.raises(ValueError, match=r"sharded_axis must be -1 \(columns\) or -2 \(rows\), got 4"):
        _split_newton_schulz(np.stack([g[:2], g[2:]]), 4)


@pytest.mark.usefixtures("highest_precision")
def test_gram_restart_products_run_at_the_requested_precision():
    """Every matmul of the Gram-space iteration, the restarts' ``Q X`` included, carries ``precision``."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 12)), jnp.float32)
    high = jax.lax.Precision.HIGH
    fn = lambda a: newton_schulz(a, "quintic", method="gram", restarts=(1, 3), precision=high)
    precisions = _dot_precisions(jax.make_jaxpr(fn)(x).jaxpr)
    assert len(precisions) > 10
    assert all(p == (high, high) for p in precisions), precisions


@pytest.mark.usefixtures("highest_precision")
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


@pytest.mark.usefixtures("highest_precision")
def test_frobenius_start_with_safety_is_rounded_to_bfloat16_once():
    """The Frobenius start ``G / (||G||_F s)`` is formed in float32 and rounded to bfloat16 once
    (within half a bfloat16 ulp of the float64 value); the identity step ``(1, 0, 0)`` returns it."""
    g = np.random.default_rng(4).standard_normal((8, 12))
    y = newton_schulz(jnp.asarray(g, jnp.float32), [(1.0, 0.0, 0.0)], compute_dtype=jnp.bfloat16, norm_safety=1.5)
    ref = g / (np.linalg.norm(g) * 1.5)
    half_ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - 8)
    assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= half_ulp + 1e-6 * np.abs(ref))


@pytest.mark.usefixtures("highest_precision")
def test_documented_defaults_and_policy_values():
    """Signature defaults, the bfloat16 restart at step 1, the float32-at-lower-precision mantissa bits,
    the ``'power'`` start's matrix-vector flops, ``steps=1`` and the padding of the power tables."""
    assert inspect.signature(so.newton_schulz).parameters["coefficients"].default == "auto"
    assert so.expert.power4_schedule(4, 8) == ("power4", "gram", (1,))
    assert so.expert.power4_schedule(8, 2) == ("power4", "gram", (1,))
    # float32 at a lower precision has float16's 10 mantissa bits, not 23: the Gram-space iteration restarts
    # every 2 steps there, as in float16, and 'auto' keeps the standard iteration (float32 at HIGHEST: Gram
    # space without restarts for a 1:8 matrix)
    for precision in ("tensorfloat32", jax.lax.Precision.DEFAULT):
        assert so.expert.gram_restarts(5, jnp.float32, precision=precision) == so.expert.gram_restarts(5, jnp.float16)
        assert so.expert.newton_schulz_method(64, 512, 5, jnp.float32, precision=precision) == "standard"
    assert so.expert.gram_restarts(5, jnp.float16) == (2, 4) and so.expert.gram_restarts(5, jnp.float32) == ()
    assert so.expert.newton_schulz_method(64, 512, 5, jnp.float32) == "gram"
    # 'power' adds POWER_ITERATIONS * POWER_STARTS = 8 * 4 products of 2 s^2 flops (s = 4).
    for method in ("standard", "gram"):
        plain = so.expert.newton_schulz_flops(4, 6, 5, method)
        assert so.expert.newton_schulz_flops(4, 6, 5, method, preconditioning="power") - plain == 8 * 4 * 2 * 4 * 4
    assert so.expert.resolve_coefficients("quintic", steps=1) == ((QUINTIC,), 1.0)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        so.expert.resolve_coefficients("quintic", steps=0)
    for name, table in (("power3", POWER3_COEFFICIENTS), ("power4", POWER4_COEFFICIENTS)):
        padded, safety = so.expert.resolve_coefficients(name, steps=6)
        assert padded == tuple(table) + (table[-1],) * (6 - len(table)) and safety == 1.0


@pytest.mark.usefixtures("highest_precision")
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


@pytest.mark.usefixtures("highest_precision")
def test_power_method_finds_the_top_singular_value_on_either_side():
    """``so.diagnostics.spectral_norm(method='power')`` (its 100 cold-started iterations): the top singular value
    of a float64 SVD, for a tall matrix, its transpose and a batch of slices (their maximum; a spectral gap of
    1 : 0.6)."""
    rng = np.random.default_rng(5)
    v, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    u, _ = np.linalg.qr(rng.standard_normal((6, 4)))
    g = (u * np.array([1.0, 0.6, 0.5, 0.2])) @ v.T  # 6 x 4, sigma_max = 1
    norm = lambda x: float(so.diagnostics.spectral_norm(jnp.asarray(x, jnp.float32), method="power"))  # noqa: E731
    np.testing.assert_allclose([norm(g), norm(2 * g), norm(g.T)], [1.0, 2.0, 1.0], rtol=1e-5)
    # a batch of slices: the maximum over them
    stacked = so.Geometry(shape=(3, 4, 6), fan_in_axes=(1,), fan_out_axes=(2,))
    batch = jnp.asarray(np.stack([g.T, 3 * g.T, 0.5 * g.T]), jnp.float32)
    np.testing.assert_allclose(float(so.diagnostics.spectral_norm(batch, stacked, method="power")), 3.0, rtol=1e-5)
