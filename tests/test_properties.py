"""Property-based tests of the dual-map transforms (hypothesis, fixed seed).

Shapes 1-D to 5-D with size-1 dimensions, very tall and very wide, stacked
layers (leading batch axes) and conv kernels (window x in -> out); dtypes
float32, bfloat16, float16; values zero, a single non-zero, denormals,
1e-30, 1e30, mixed magnitudes, Gaussian. Properties:

* finite input -> finite output, same shape and dtype; a non-zero input
  (other than denormals, which XLA:CPU flushes to zero) gives a non-zero one;
* zero input -> zero update;
* scale invariance ``D(c G) = D(G)``, ``c > 0`` (every normalizing dual);
* sign equivariance ``D(-G) = -D(G)`` (every dual is odd);
* equivariance under the symmetries of each norm: signed permutations of the
  fan-in and fan-out indices for the l_p row / column duals and the RMS
  rule, orthogonal maps on either side for the spectral duals
  (Newton-Schulz, Frobenius);
* a stacked call equals a loop over the slices.

Run ``pytest --hypothesis-profile=thorough tests/test_properties.py`` for
the >= 10,000-case run (see tests/conftest.py).
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import spectral_optax as so
from spectral_optax import Geometry

# float64 / cross-path comparisons: true float32 matmuls on every backend (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("highest_precision")

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ALL_DTYPES = tuple(sorted(DTYPES))
PATTERNS = ("gaussian", "zero", "single", "denormal", "tiny", "huge", "mixed")

# name -> (transform factory, symmetry group: 'signed_perm' or 'orthogonal')
DUALS = {
    "row_p1": (lambda g: so.scale_by_row_norm(1.0, geometry=g), "signed_perm"),
    "row_p1.5": (lambda g: so.scale_by_row_norm(1.5, geometry=g), "signed_perm"),
    "row_p2": (lambda g: so.scale_by_row_norm(2.0, geometry=g), "signed_perm"),
    "row_p3.7": (lambda g: so.scale_by_row_norm(3.7, geometry=g), "signed_perm"),
    "col_q2": (lambda g: so.scale_by_column_norm(2.0, geometry=g), "signed_perm"),
    "col_qinf": (lambda g: so.scale_by_column_norm(math.inf, geometry=g), "signed_perm"),
    "col_q1.5": (lambda g: so.scale_by_column_norm(1.5, geometry=g), "signed_perm"),
    "fan_out_rms": (lambda g: so.scale_by_fan_out_rms(geometry=g), "signed_perm"),
    "spectral_frobenius": (lambda g: so.scale_by_spectral_norm(geometry=g), "orthogonal"),
    "newton_schulz": (lambda g: so.orthogonalize_via_newton_schulz(geometry=g, compute_dtype=jnp.float32),
                      "orthogonal"),
}


def values(shape, pattern, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if pattern == "zero":
        return np.zeros(shape)
    if pattern == "single":
        x = np.zeros(n)
        if n:
            x[rng.integers(n)] = rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-3, 3)
        return x.reshape(shape)
    g = rng.standard_normal(shape)
    scale = {"gaussian": 1.0, "denormal": 1e-41, "tiny": 1e-30, "huge": 1e30}.get(pattern)
    if scale is None:  # mixed magnitudes: 1e-20 .. 1e20 entry by entry
        scale = 10.0 ** rng.uniform(-20, 20, size=shape)
    return g * scale


@st.composite
def cases(draw, dtypes=ALL_DTYPES, patterns=PATTERNS,
          layouts=("matrix", "stacked", "conv", "vector", "tall", "wide")):
    """(array, geometry, dtype name, pattern): a leaf and how it acts as matrices.

    Few distinct sizes, so that eager JAX reuses its per-shape kernels across examples.
    """
    layout = draw(st.sampled_from(layouts))
    dim = st.sampled_from([1, 3, 8])
    if layout == "matrix":
        shape = (draw(dim), draw(dim))
        geom = Geometry.matrix(shape)
    elif layout == "stacked":  # 1 or 2 leading batch axes (nn.scan layers, experts)
        lead = tuple(draw(st.lists(dim, min_size=1, max_size=2)))
        shape = lead + (draw(dim), draw(dim))
        geom = Geometry.matrix(shape)
    elif layout == "conv":  # (window..., in, out): 3-D to 5-D
        window = tuple(draw(st.lists(st.sampled_from([1, 3]), min_size=1, max_size=3)))
        shape = window + (draw(dim), draw(dim))
        geom = Geometry(shape, "matrix", tuple(range(len(shape) - 1)), (len(shape) - 1,))
    elif layout == "vector":
        shape = (draw(st.sampled_from([1, 7, 64])),)
        geom = Geometry.vector(shape)
    elif layout == "tall":
        shape = (draw(st.sampled_from([64, 200])), draw(st.sampled_from([1, 3])))
        geom = Geometry.matrix(shape)
    else:
        shape = (draw(st.sampled_from([1, 3])), draw(st.sampled_from([64, 200])))
        geom = Geometry.matrix(shape)
    dtype = draw(st.sampled_from(dtypes))
    pattern = draw(st.sampled_from(patterns))
    x = values(shape, pattern, draw(st.integers(0, 2**16)))
    with np.errstate(over="ignore"):
        xd = np.asarray(jnp.asarray(x, DTYPES[dtype]).astype(jnp.float32))
    if not np.all(np.isfinite(xd)):  # 1e30 overflows float16: saturate to its largest finite value
        x = np.clip(x, -60000.0, 60000.0)
    return jnp.asarray(x, DTYPES[dtype]), geom, dtype, pattern


def apply(name, geom, x):
    tx = DUALS[name][0]({r".*": geom})
    tree = {"w": x}
    out, _ = tx.update(tree, tx.init(tree))
    return out["w"]


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def close(a, b, dtype):
    a, b = f64(a), f64(b)
    tol = 1e-4 if dtype == "float32" else 3e-2
    scale = max(np.max(np.abs(b)), 1e-30) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


NAMES = st.sampled_from(sorted(DUALS))


@given(case=cases(), name=NAMES)
def test_finite_in_finite_out_same_shape_dtype_and_zero_to_zero(case, name):
    x, geom, _, pattern = case
    y = apply(name, geom, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.all(np.isfinite(f64(y)))
    if pattern == "zero":
        assert not np.any(f64(y))
    elif pattern != "denormal" and np.any(f64(x)):
        # A non-zero input gives a non-zero direction (also for 1e-30 and 1e30). Denormal
        # inputs may give zero: XLA on CPU flushes denormals to zero (documented in
        # docs/reliability.md).
        assert np.any(f64(y))


@given(case=cases(dtypes=("float32",), patterns=("gaussian", "single", "tiny", "huge", "mixed")),
       name=NAMES, c=st.sampled_from([0.25, 0.37, 7.0, 1024.0]))
def test_scale_invariance_and_sign_equivariance(case, name, c):
    """float32 (in bf16 / f16 ``c G`` is rounded, so ``D(c G) = D(G)`` holds only to the rounding)."""
    x, geom, dtype, _ = case
    xc = x * c
    y = apply(name, geom, x)
    close(apply(name, geom, xc), y, dtype)
    close(apply(name, geom, -x), -f64(y), dtype)


def _signed_perm(n, rng):
    m = np.zeros((n, n))
    m[np.arange(n), rng.permutation(n)] = rng.choice([-1.0, 1.0], size=n)
    return m


def _orthogonal(n, rng):
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


@given(case=cases(dtypes=("float32",), patterns=("gaussian", "single", "tiny", "huge"),
                 layouts=("matrix", "stacked", "conv", "tall", "wide")),
       name=NAMES, seed=st.integers(0, 1000))
def test_equivariance_under_the_norms_symmetries(case, name, seed):
    x, geom, dtype, pattern = case
    rng = np.random.default_rng(seed)
    group = DUALS[name][1]
    make = _signed_perm if group == "signed_perm" else _orthogonal
    m = f64(so.expert.to_matrix(x, geom))  # (slices, d_in, d_out)
    if group == "orthogonal" and pattern != "gaussian":
        return  # orthogonal mixing of 1e30 / 1e-30 entries is not exact in float32; the sign case covers them
    left, right = make(geom.d_in, rng), make(geom.d_out, rng)
    mixed = np.einsum("ij,sjk,kl->sil", left, m, right)
    y = f64(so.expert.to_matrix(apply(name, geom, x), geom))
    y_mixed = f64(so.expert.to_matrix(apply(name, geom, so.expert.from_matrix(jnp.asarray(mixed, jnp.float32), geom)), geom))
    close(y_mixed, np.einsum("ij,sjk,kl->sil", left, y, right), dtype)


@given(case=cases(layouts=("stacked",)), name=NAMES)
def test_stacked_call_equals_loop_over_slices(case, name):
    x, geom, dtype, _ = case
    assume(geom.num_slices > 1)
    y = so.expert.to_matrix(apply(name, geom, x), geom)
    m = so.expert.to_matrix(x, geom)
    for s in range(geom.num_slices):
        one = Geometry.matrix(m[s].shape)
        close(apply(name, one, m[s]), y[s], dtype)
