"""Newton-Schulz iterations and coefficient schedules, checked against float64 SVDs."""


import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_optax as so
from spectral_optax._duals.polar import newton_schulz, optimal_quintic, polar_express_coefficients

# The package exports the function `newton_schulz`, which shadows the module name.
import spectral_optax._duals.polar as ns_mod

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
    assert all(b < a for a, b in zip(err, err[1:]))
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
        newton_schulz(x, so.polar_express_coefficients(8), steps=5)
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


def test_auto_method_picks_gram_only_when_cheaper_and_f32():
    assert ns_mod._use_gram("auto", 768, 3072, 5, jnp.float32)
    assert ns_mod._use_gram("auto", 3072, 768, 5, jnp.float32)
    assert not ns_mod._use_gram("auto", 768, 768, 5, jnp.float32)
    assert not ns_mod._use_gram("auto", 768, 3072, 5, jnp.bfloat16)


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
            z = newton_schulz(jnp.asarray(g * factor, jnp.float32), method=method)
            assert np.all(np.isfinite(np.asarray(z)))
            np.testing.assert_allclose(np.asarray(z), np.asarray(y[1]), atol=1e-5)


def test_batched_equals_loop_and_transpose_symmetry():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, 3, 12, 30)), jnp.float32)
    for method in ("standard", "gram"):
        y = newton_schulz(x, method=method)
        assert y.shape == x.shape
        for i in range(2):
            for j in range(3):
                np.testing.assert_allclose(
                    np.asarray(y[i, j]), np.asarray(newton_schulz(x[i, j], method=method)), atol=1e-5
                )
        # NS(X^T) = NS(X)^T: the tall orientation is the same map.
        yt = newton_schulz(jnp.swapaxes(x, -1, -2), method=method)
        np.testing.assert_allclose(np.asarray(yt), np.asarray(jnp.swapaxes(y, -1, -2)), atol=1e-5)


def test_user_table_and_user_function():
    rng = np.random.default_rng(5)
    g = jnp.asarray(rng.normal(size=(10, 20)), jnp.float32)
    np.testing.assert_allclose(
        np.asarray(newton_schulz(g, [so.MUON_QUINTIC] * 5)), np.asarray(newton_schulz(g, "quintic")), atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(newton_schulz(g, so.MUON_QUINTIC, steps=5)), np.asarray(newton_schulz(g)), atol=1e-6
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
    assert ns_mod.newton_schulz_flops(m, n, k) == k * (4 * m * m * n + 2 * m**3)
    assert ns_mod.newton_schulz_flops(n, m, k, "gram") == 4 * m * m * n + 2 * m**3 * (4 * k - 3)
