"""Row / column dual maps and their transforms against float64 NumPy references.

The references below re-derive the formulas of docs/math.md section 3 and do
their own reshaping (conv fan-in = window x channels, stacked layers looped,
QKV blocks sliced), so they share no code with the package.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so

P_VALUES = [1.0, 1.5, 2.0, 2.5, 3.0]
Q_VALUES = [2.0, 4.0, math.inf]

# name -> (param path, shape); every shape resolves by Flax naming rules.
SHAPES = {
    "square": (("Dense_0", "kernel"), (24, 24)),
    "wide": (("Dense_0", "kernel"), (12, 40)),
    "tall": (("Dense_0", "kernel"), (40, 12)),
    "conv": (("Conv_0", "kernel"), (3, 3, 4, 8)),
    "stacked": (("Dense_0", "kernel"), (3, 10, 14)),
}


# ---------------------------------------------------------------------------
# Independent float64 references.
# ---------------------------------------------------------------------------
def ref_slices(x, name):
    """The list of (d_in, d_out) matrices of a test parameter, by hand."""
    x = np.asarray(x, np.float64)
    if name == "conv":
        return [x.reshape(-1, x.shape[-1])]
    if name == "stacked":
        return [x[k] for k in range(x.shape[0])]
    return [x]


def ref_unslice(mats, name, shape):
    if name == "stacked":
        return np.stack(mats)
    return mats[0].reshape(shape)


def lp_dual(v, p):
    """The unit-l_{p*} vector maximizing ``<v, d>``: ``sign(v) |v|^(p-1) / ||v||_p^(p-1)`` (``sign(v)`` for p = 1)."""
    if p == 1:
        return np.sign(v)
    return np.sign(v) * np.abs(v) ** (p - 1) / np.sum(np.abs(v) ** p) ** ((p - 1) / p)


def ref_row(g, p, fan_scaling=True):
    """(p,mean)->inf dual of one (d_in, d_out) matrix, column by column."""
    d_in, d_out = g.shape
    out = np.zeros_like(g)
    for i in range(d_out):
        if np.any(g[:, i]):
            out[:, i] = lp_dual(g[:, i], p) * (d_in ** (-1.0 / p) if fan_scaling else 1.0)
    return out


def ref_col(g, q):
    """(1,mean)->(q,mean) dual of one (d_in, d_out) matrix, row by row."""
    d_in, d_out = g.shape
    qs = 1.0 if math.isinf(q) else q / (q - 1)
    scale = (1.0 if math.isinf(q) else d_out ** (1.0 / q)) / d_in
    out = np.zeros_like(g)
    for j in range(d_in):
        if np.any(g[j]):
            out[j] = lp_dual(g[j], qs) * scale
    return out


def tree_for(name, x):
    path, _ = SHAPES[name]
    return {path[0]: {path[1]: x}}


def leaf_of(name, tree):
    path, _ = SHAPES[name]
    return tree[path[0]][path[1]]


def apply(tx, tree):
    out, _ = tx.update(tree, tx.init(tree))
    return out


def rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# Agreement with the references.
# ---------------------------------------------------------------------------
# (transform, float64 reference, its exponent, seed): row norms over P_VALUES, column norms over Q_VALUES.
NORM_CASES = [pytest.param(so.scale_by_row_norm, ref_row, p, 1, id=f"row-{p}") for p in P_VALUES] + [
    pytest.param(so.scale_by_column_norm, ref_col, q, 2, id=f"col-{q}") for q in Q_VALUES
]


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("transform, reference, exponent, seed", NORM_CASES)
def test_row_and_column_norms_match_reference(name, transform, reference, exponent, seed):
    shape = SHAPES[name][1]
    g = rand(shape, seed=seed)
    got = leaf_of(name, apply(transform(exponent), tree_for(name, jnp.asarray(g))))
    want = ref_unslice([reference(m, exponent) for m in ref_slices(g, name)], name, shape)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=1e-7)


def test_p1_is_sign_over_d_in_exactly_and_q_inf_too():
    g = rand((16, 8), seed=3)
    g[0, 0] = 0.0
    want = np.sign(g) / np.float32(16)
    np.testing.assert_array_equal(np.asarray(so.expert.row_normalize(jnp.asarray(g)[None], 1.0))[0], want)
    np.testing.assert_array_equal(np.asarray(so.expert.column_normalize(jnp.asarray(g)[None], math.inf))[0], want)


def test_head_rule_without_fan_scaling():
    g = rand((20, 6), seed=4)
    got = so.expert.row_normalize(jnp.asarray(g)[None], 2.5, fan_scaling=False)[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), ref_row(g.astype(np.float64), 2.5, False), rtol=2e-5)


# ---------------------------------------------------------------------------
# The duality statements (corrected form, see module docstring of duals).
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("shape", [(24, 24), (12, 40), (40, 12)])
def test_row_direction_is_unit_in_the_operator_norm(p, shape):
    """Every fan-in vector d_i has ||d_i||_{p*} = d_in^(-1/p) (unit l_{p*}
    norm only without the fan scaling), <g_i, d_i> = d_in^(-1/p) ||g_i||_p,
    and the (p,mean)->inf operator norm of D, by Hoelder and attained by an
    explicit input, is exactly 1."""
    g = rand(shape, seed=5).astype(np.float64)
    d_in = shape[0]
    d = np.asarray(so.expert.row_normalize(jnp.asarray(g, jnp.float32)[None], p)[0], np.float64)
    ps = math.inf if p == 1 else p / (p - 1)
    col_norms = np.linalg.norm(d, ord=ps, axis=0)
    np.testing.assert_allclose(col_norms, d_in ** (-1 / p), rtol=1e-5)
    np.testing.assert_allclose(np.sum(g * d, axis=0), d_in ** (-1 / p) * np.linalg.norm(g, ord=p, axis=0), rtol=1e-5)
    # ||D||_{(p,mean)->inf} = sup ||x @ D||_inf / ||x||_{p,mean}: attained at the
    # Hoelder-extremal x of the best column.
    i = int(np.argmax(col_norms))
    col = d[:, i]
    x = np.sign(col) if p == 1 else np.sign(col) * np.abs(col) ** (ps - 1)
    ratio = np.max(np.abs(x @ d)) / np.mean(np.abs(x) ** p) ** (1 / p)
    np.testing.assert_allclose(ratio, 1.0, rtol=1e-5)
    xs = np.random.default_rng(0).standard_normal((200, d_in))
    ratios = np.max(np.abs(xs @ d), axis=1) / np.mean(np.abs(xs) ** p, axis=1) ** (1 / p)
    assert np.all(ratios <= 1 + 1e-5)


@pytest.mark.parametrize("q", Q_VALUES)
def test_col_direction_is_unit_in_the_operator_norm(q):
    g = rand((10, 30), seed=6).astype(np.float64)
    d_in, d_out = g.shape
    d = np.asarray(so.expert.column_normalize(jnp.asarray(g, jnp.float32)[None], q)[0], np.float64)
    row_norms = np.linalg.norm(d, ord=q, axis=1)
    np.testing.assert_allclose(row_norms, (1.0 if math.isinf(q) else d_out ** (1 / q)) / d_in, rtol=1e-5)
    # ||D||_{(1,mean)->(q,mean)} = d_in d_out^(-1/q) max_j ||d_j||_q = 1
    op = d_in * (1.0 if math.isinf(q) else d_out ** (-1 / q)) * row_norms.max()
    np.testing.assert_allclose(op, 1.0, rtol=1e-5)
    qs = 1.0 if math.isinf(q) else q / (q - 1)
    np.testing.assert_allclose(
        np.sum(g * d, axis=1), np.linalg.norm(g, ord=qs, axis=1) * row_norms, rtol=1e-5
    )


# ---------------------------------------------------------------------------
# Scale invariance, zeros, extreme magnitudes, dtypes.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 2.5, 3.0, 1.7])
@pytest.mark.parametrize("c", [1e-30, 3e-3, 7.0, 1e30])
def test_scale_invariance_and_extreme_magnitudes(p, c):
    g = rand((1, 16, 12), seed=7)
    base = np.asarray(so.expert.row_normalize(jnp.asarray(g), p))
    scaled = np.asarray(so.expert.row_normalize(jnp.asarray(g * np.float32(c)), p))
    assert np.all(np.isfinite(scaled))
    np.testing.assert_allclose(scaled, base, rtol=1e-5, atol=1e-8)
    qc = 1.0 + 1.0 / (p - 1) if p > 1 else math.inf  # q with q* = p
    base_c = np.asarray(so.expert.column_normalize(jnp.asarray(g), qc))
    scaled_c = np.asarray(so.expert.column_normalize(jnp.asarray(g * np.float32(c)), qc))
    assert np.all(np.isfinite(scaled_c))
    np.testing.assert_allclose(scaled_c, base_c, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("p", P_VALUES)
def test_zero_rows_and_zero_matrix(p):
    g = rand((16, 6), seed=8)
    g[:, 2] = 0.0  # an output neuron with zero gradient
    g[5, :] = 0.0  # an input with zero gradient
    d = np.asarray(so.expert.row_normalize(jnp.asarray(g)[None], p)[0])
    assert np.all(np.isfinite(d)) and np.all(d[:, 2] == 0)
    np.testing.assert_allclose(d, ref_row(g.astype(np.float64), p), rtol=2e-5, atol=1e-7)
    c = np.asarray(so.expert.column_normalize(jnp.asarray(g)[None], 2.0)[0])
    assert np.all(np.isfinite(c)) and np.all(c[5] == 0)
    z = jnp.zeros((2, 16, 6))
    assert np.all(np.asarray(so.expert.row_normalize(z, p)) == 0)
    assert np.all(np.asarray(so.expert.column_normalize(z, 4.0)) == 0)


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 2.5])
def test_bf16_preserved_and_finite(p):
    g = rand((24, 24), seed=9)
    tree = {"Dense_0": {"kernel": jnp.asarray(g * 1e30, jnp.bfloat16)}}
    out = apply(so.scale_by_row_norm(p), tree)["Dense_0"]["kernel"]
    assert out.dtype == jnp.bfloat16
    out = np.asarray(out, np.float64)
    assert np.all(np.isfinite(out))
    want = ref_row(np.asarray(jnp.asarray(g * 1e30, jnp.bfloat16), np.float64), p)
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=1e-4)
    tiny = apply(so.scale_by_column_norm(2.0), {"Dense_0": {"kernel": jnp.asarray(g * 1e-30, jnp.bfloat16)}})
    assert np.all(np.isfinite(np.asarray(tiny["Dense_0"]["kernel"], np.float32)))


def test_traced_exponent_matches_static():
    """Under jit / inject_hyperparams p and q are arrays: the exp/log path must
    agree with the static path (including p = 1 and q = inf)."""
    g = jnp.asarray(rand((2, 16, 9), seed=10))
    g = g.at[0, :, 3].set(0.0)
    for p in [1.0, 1.5, 2.0, 2.7]:
        np.testing.assert_allclose(
            jax.jit(so.expert.row_normalize)(g, p), so.expert.row_normalize(g, p), rtol=1e-5, atol=1e-8
        )
    for q in [1.5, 2.0, math.inf]:
        np.testing.assert_allclose(
            jax.jit(so.expert.column_normalize)(g, q), so.expert.column_normalize(g, q), rtol=1e-5, atol=1e-8
        )


# ---------------------------------------------------------------------------
# Fused QKV and other geometry.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1.5, 2.0])
def test_qkv_split_equals_blocks_normalized_separately(p):
    d, heads_out = 16, 3 * 8
    g = rand((d, heads_out), seed=11)
    g[:, :8] *= 100.0  # Q block much larger: a shared normalization would differ
    tree = {"attn": {"qkv": {"kernel": jnp.asarray(g)}}}
    geo = {r"qkv/kernel$": dict(kind="matrix", fan_out_splits=3)}
    row = np.asarray(apply(so.scale_by_row_norm(p, geometry=geo), tree)["attn"]["qkv"]["kernel"])
    col = np.asarray(apply(so.scale_by_column_norm(2.0, geometry=geo), tree)["attn"]["qkv"]["kernel"])
    g64 = g.astype(np.float64)
    blocks = [g64[:, k * 8 : (k + 1) * 8] for k in range(3)]
    np.testing.assert_allclose(row, np.concatenate([ref_row(b, p) for b in blocks], 1), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(col, np.concatenate([ref_col(b, 2.0) for b in blocks], 1), rtol=2e-5, atol=1e-7)
    # and differs from treating the kernel as one matrix (the test can fail)
    whole = ref_col(g64, 2.0)
    assert not np.allclose(col, whole, rtol=1e-3)


def test_vectors_become_sign_and_embedding_uses_canonical_view():
    tree = {"Dense_0": {"bias": jnp.asarray([0.5, -2.0, 0.0])}, "LayerNorm_0": {"scale": jnp.asarray([3.0, -1e-20])}}
    out = apply(so.scale_by_row_norm(2.5), tree)
    np.testing.assert_array_equal(np.asarray(out["Dense_0"]["bias"]), [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(out["LayerNorm_0"]["scale"]), [1.0, -1.0])
    np.testing.assert_array_equal(np.asarray(apply(so.scale_by_sign(), tree)["Dense_0"]["bias"]), [1.0, -1.0, 0.0])


def test_jit_and_masked_trees():
    tree = {"Dense_0": {"kernel": jnp.asarray(rand((8, 4), seed=12))}, "Dense_1": {"kernel": jnp.ones((4, 2))}}
    tx = optax.partition(
        {"a": so.scale_by_row_norm(2.0), "b": optax.set_to_zero()},
        {"Dense_0": {"kernel": "a"}, "Dense_1": {"kernel": "b"}},
    )
    out, _ = jax.jit(tx.update)(tree, tx.init(tree))
    want = ref_row(np.asarray(tree["Dense_0"]["kernel"], np.float64), 2.0)
    np.testing.assert_allclose(np.asarray(out["Dense_0"]["kernel"]), want, rtol=2e-5)
    assert np.all(np.asarray(out["Dense_1"]["kernel"]) == 0)


@pytest.mark.parametrize("bad", [0.5, 0.0, math.inf, -1.0])
def test_bad_p_raises(bad):
    with pytest.raises(ValueError, match="p must be in"):
        so.scale_by_row_norm(bad)


@pytest.mark.parametrize("bad", [1.0, 0.5])
def test_bad_q_raises(bad):
    with pytest.raises(ValueError, match="q must be in"):
        so.scale_by_column_norm(bad)


def test_unresolvable_geometry_names_the_path():
    tree = {"blocks": {"mystery": jnp.ones((2, 3, 4))}}
    with pytest.raises(so.GeometryError, match="blocks/mystery"):
        apply(so.scale_by_row_norm(2.0, geometry=so.GeometryMap(strict=True)), tree)
    # Default: the element-wise fallback, every entry its own 1 x 1 slice -> sign.
    signed = -2.0 * tree["blocks"]["mystery"]
    with pytest.warns(so.GeometryWarning, match="blocks/mystery"):
        out = apply(so.scale_by_row_norm(2.0), {"blocks": {"mystery": signed}})
    np.testing.assert_array_equal(out["blocks"]["mystery"], np.sign(signed))
