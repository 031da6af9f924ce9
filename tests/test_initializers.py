"""Tests for spectral_optax.initializers against independent float64 NumPy references.

The reference matrix view is rebuilt here with NumPy (moveaxis + reshape), not with
spectral_optax.expert.to_matrix, and singular values come from a float64 SVD.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import spectral_optax as so
from spectral_optax import initializers as I

KEY = jax.random.key(0)


def np_slices(w, in_axes, out_axes, batch_axes=()):
    """(batch, d_in, d_out) float64 view of w, built independently with NumPy."""
    w = np.asarray(w, dtype=np.float64)
    perm = tuple(batch_axes) + tuple(in_axes) + tuple(out_axes)
    w = np.transpose(w, perm)
    nb = len(batch_axes)
    b = int(np.prod(w.shape[:nb])) if nb else 1
    d_in = int(np.prod(w.shape[nb : nb + len(in_axes)]))
    return w.reshape(b, d_in, -1)


def sigmas(m):
    return np.linalg.svd(m, compute_uv=False)


# shape, init kwargs, (in_axes, out_axes, batch_axes) for the NumPy reference
CASES = {
    "square": ((64, 64), {}, ((0,), (1,), ())),
    "wide": ((32, 128), {}, ((0,), (1,), ())),
    "tall": ((128, 32), {}, ((0,), (1,), ())),
    "conv": ((3, 3, 16, 32), {}, ((0, 1, 2), (3,), ())),  # d_in = 3*3*16, d_out = 32
    "conv_explicit_in_axis": ((3, 3, 16, 8), {"in_axis": -2}, ((0, 1, 2), (3,), ())),
    "stacked": ((4, 32, 64), {"batch_axis": 0}, ((1,), (2,), (0,))),
    "stacked_tall": ((3, 96, 16), {"batch_axis": (0,)}, ((1,), (2,), (0,))),
    "dense_general_out": ((48, 4, 8), {"out_axis": (-2, -1)}, ((0,), (1, 2), ())),
    "dense_general_in": ((4, 8, 24), {"in_axis": (0, 1)}, ((0, 1), (2,), ())),
}


# --------------------------------------------------------------------------
# spectral_orthogonal
# --------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("gain", [1.0, math.sqrt(2)])
def test_orthogonal_spectral_norm_exact_per_slice(name, gain):
    shape, kw, axes = CASES[name]
    w = I.spectral_orthogonal(gain=gain, **kw)(KEY, shape)
    assert w.shape == shape and w.dtype == jnp.float32
    m = np_slices(w, *axes)
    d_in, d_out = m.shape[1:]
    target = gain * math.sqrt(d_out / d_in)
    for s in m:
        sv = sigmas(s)
        # every singular value (semi-orthogonal), hence the spectral norm, is the target
        np.testing.assert_allclose(sv, target, rtol=1e-4)


def test_orthogonal_slices_are_independent():
    w = np.asarray(I.spectral_orthogonal(batch_axis=0)(KEY, (3, 16, 16)))
    assert not np.allclose(w[0], w[1]) and not np.allclose(w[1], w[2])


def test_orthogonal_fused_qkv_blocks():
    # (in, 3 * d) kernel: each of the 3 blocks is its own (64, 32) matrix of norm sqrt(32/64)
    w = np.asarray(I.spectral_orthogonal(fan_out_splits=3)(KEY, (64, 96)), np.float64)
    for blk in np.split(w, 3, axis=1):
        np.testing.assert_allclose(sigmas(blk), math.sqrt(32 / 64), rtol=1e-4)
    # without the split the whole (64, 96) matrix is semi-orthogonal instead
    w1 = np.asarray(I.spectral_orthogonal()(KEY, (64, 96)), np.float64)
    np.testing.assert_allclose(sigmas(w1), math.sqrt(96 / 64), rtol=1e-4)


def test_orthogonal_is_haar_sign_corrected():
    # Without moving sign(diag(R)) into Q, E[Q00] is about -0.4 (LAPACK's Householder signs);
    # a Haar matrix has mean zero entries. 4000 slices: standard error ~ 0.5/sqrt(4000) = 0.008.
    w = np.asarray(I.spectral_orthogonal(batch_axis=0)(KEY, (4000, 4, 4)), np.float64)
    assert abs(w[:, 0, 0].mean()) < 0.04
    assert abs(w[:, 3, 3].mean()) < 0.04
    # Haar columns: E[Q_ij^2] = 1/4 for a 4x4 orthogonal matrix
    np.testing.assert_allclose((w**2).mean(axis=0), 0.25, atol=0.03)


# --------------------------------------------------------------------------
# spectral_normal
# --------------------------------------------------------------------------
NORMAL_CASES = {
    "square": ((256, 256), ((0,), (1,), ())),
    "wide": ((256, 1024), ((0,), (1,), ())),
    "tall": ((1024, 256), ((0,), (1,), ())),
    "conv": ((3, 3, 64, 256), ((0, 1, 2), (3,), ())),  # d_in 576 > d_out 256
    "stacked": ((2, 256, 512), ((1,), (2,), (0,))),
}


@pytest.mark.parametrize("name", list(NORMAL_CASES))
@pytest.mark.parametrize("gain", [1.0, 2.0])
def test_normal_std_and_spectral_norm(name, gain):
    shape, axes = NORMAL_CASES[name]
    kw = {"batch_axis": 0} if axes[2] else {}
    w = I.spectral_normal(gain=gain, **kw)(KEY, shape)
    assert w.dtype == jnp.float32
    m = np_slices(w, *axes)
    d_in, d_out = m.shape[1:]
    std = gain / math.sqrt(d_in) * min(1.0, math.sqrt(d_out / d_in))
    assert abs(m.std() / std - 1) < 0.03
    assert abs(m.mean()) < 0.1 * std
    target = gain * math.sqrt(d_out / d_in)
    predicted = std * (math.sqrt(d_in) + math.sqrt(d_out))  # Bai-Yin edge
    assert 1.0 <= predicted / target <= 2.0
    for s in m:
        top = sigmas(s)[0]
        assert abs(top / predicted - 1) < 0.05, (top, predicted)
        assert 0.95 * target <= top <= 2.05 * target


def test_normal_worked_example_reference_section_2():
    # input 3072, hidden 4096, one output, sigma0 = sqrt(2): std = 0.0255, 0.0221, 0.000345
    init = I.spectral_normal(gain=math.sqrt(2))
    k1, k2, k3 = jax.random.split(KEY, 3)
    s1 = np.asarray(init(k1, (3072, 4096)), np.float64).std()
    s2 = np.asarray(init(k2, (4096, 4096)), np.float64).std()
    # the (4096, 1) head: draw 64 independent copies through batch_axis for a tight estimate
    s3 = np.asarray(I.spectral_normal(gain=math.sqrt(2), batch_axis=0)(k3, (64, 4096, 1)), np.float64).std()
    np.testing.assert_allclose([s1, s2, s3], [0.0255, 0.0221, 0.000345], rtol=0.01)


def test_normal_matches_lecun_scale_when_not_shrinking():
    # d_out >= d_in: std = gain / sqrt(fan_in) with fan_in = window x in, like variance_scaling
    w = np.asarray(I.spectral_normal()(KEY, (3, 3, 32, 512)), np.float64)
    assert abs(w.std() * math.sqrt(3 * 3 * 32) - 1) < 0.03


# --------------------------------------------------------------------------
# spectral_embedding
# --------------------------------------------------------------------------
@pytest.mark.parametrize("std", [1.0, 0.5])
def test_embedding_entries_theta_one(std):
    for features in (64, 1024):  # independent of width
        w = np.asarray(I.spectral_embedding(std=std)(KEY, (512, features)), np.float64)
        assert abs(w.std() / std - 1) < 0.03
        rms_per_token = np.sqrt((w**2).mean(axis=1))
        assert np.median(rms_per_token) == pytest.approx(std, rel=0.1)


# --------------------------------------------------------------------------
# dtype, determinism, edge cases
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make", [lambda: I.spectral_normal(), lambda: I.spectral_orthogonal(), lambda: I.spectral_embedding()]
)
def test_bf16_is_cast_of_f32_draw(make):
    init = make()
    w16 = init(KEY, (64, 32), jnp.bfloat16)
    w32 = init(KEY, (64, 32), jnp.float32)
    assert w16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(w16), np.asarray(w32.astype(jnp.bfloat16)))
    assert np.all(np.isfinite(np.asarray(w16, np.float32)))


def test_bf16_orthogonal_spectral_norm():
    w = I.spectral_orthogonal(gain=2.0)(KEY, (128, 64), jnp.bfloat16)
    np.testing.assert_allclose(sigmas(np.asarray(w, np.float64)), 2.0 * math.sqrt(64 / 128), rtol=2e-2)


def test_factory_dtype_default_and_override():
    init = I.spectral_normal(dtype=jnp.bfloat16)
    assert init(KEY, (8, 8)).dtype == jnp.bfloat16
    assert init(KEY, (8, 8), jnp.float32).dtype == jnp.float32


def test_deterministic_in_key():
    init = I.spectral_orthogonal()
    a, b = init(KEY, (16, 8)), init(KEY, (16, 8))
    c = init(jax.random.key(1), (16, 8))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))


def test_jit_and_zero_size():
    init = I.spectral_orthogonal()
    w = jax.jit(init, static_argnums=1)(KEY, (8, 4))
    np.testing.assert_allclose(sigmas(np.asarray(w, np.float64)), math.sqrt(4 / 8), rtol=1e-4)
    for make in (I.spectral_normal, I.spectral_orthogonal):
        assert make()(KEY, (0, 4)).shape == (0, 4)


# --------------------------------------------------------------------------
# Errors: name the shape, the axes and the fix
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, shape, expect",
    [
        ({}, (5,), "1-D shape"),
        ({}, (), "0-D shape"),
        ({"out_axis": 2}, (4, 5), "out_axis [2] out of range"),
        ({"batch_axis": -3}, (4, 5), "batch_axis [-3] out of range"),
        ({"in_axis": 0, "out_axis": (0, 1)}, (4, 5), "in_axis and out_axis share"),
        ({"batch_axis": 1}, (4, 5), "out_axis and batch_axis share"),
        ({"out_axis": (0, 1)}, (4, 5), "no axis is left for the fan-in"),
        ({"out_axis": ()}, (4, 5), "out_axis is empty"),
        ({"fan_out_splits": 3}, (4, 5), "fan_out_splits=3"),
    ],
)
@pytest.mark.parametrize("make", [I.spectral_normal, I.spectral_orthogonal])
def test_bad_axes_clear_error(make, kw, shape, expect):
    with pytest.raises(ValueError) as e:
        make(**kw)(KEY, shape)
    msg = str(e.value)
    assert expect in msg
    assert str(tuple(shape)) in msg and "out_axis" in msg


def test_bad_dtype_and_gain():
    with pytest.raises(ValueError, match="floating-point"):
        I.spectral_normal()(KEY, (4, 4), jnp.int32)
    with pytest.raises(ValueError, match="gain"):
        I.spectral_orthogonal(gain=-1.0)
    with pytest.raises(ValueError, match="std"):
        I.spectral_embedding(std=float("nan"))
    with pytest.raises(ValueError, match="embedding table"):
        I.spectral_embedding()(KEY, ())


# --------------------------------------------------------------------------
# Flax integration
# --------------------------------------------------------------------------
def test_linen_dense_conv_embed():
    x = jnp.ones((2, 8, 8, 16))
    conv = nn.Conv(32, (3, 3), kernel_init=I.spectral_orthogonal(gain=1.0))
    k = conv.init(KEY, x)["params"]["kernel"]
    assert k.shape == (3, 3, 16, 32)
    np.testing.assert_allclose(sigmas(np_slices(k, (0, 1, 2), (3,))[0]), math.sqrt(32 / 144), rtol=1e-4)

    dense = nn.Dense(1, kernel_init=I.spectral_normal(gain=math.sqrt(2)), param_dtype=jnp.bfloat16)
    p = dense.init(KEY, jnp.ones((2, 4096)))["params"]
    assert p["kernel"].dtype == jnp.bfloat16
    assert abs(np.asarray(p["kernel"], np.float64).std() / 0.000345 - 1) < 0.1
    assert np.all(np.asarray(p["bias"]) == 0)

    emb = nn.Embed(1000, 256, embedding_init=I.spectral_embedding())
    t = emb.init(KEY, jnp.zeros((3,), jnp.int32))["params"]["embedding"]
    assert t.shape == (1000, 256) and abs(np.asarray(t).std() - 1) < 0.03


def test_linen_scan_stacked_layers():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return nn.Dense(32, kernel_init=I.spectral_orthogonal(gain=1.0), use_bias=False)(h), None

    Stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
    k = Stack().init(KEY, jnp.ones((2, 32)), None)["params"]["Dense_0"]["kernel"]
    assert k.shape == (3, 32, 32)
    for s in np_slices(k, (1,), (2,), (0,)):
        np.testing.assert_allclose(sigmas(s), 1.0, rtol=1e-4)
    assert not np.allclose(np.asarray(k[0]), np.asarray(k[1]))


def test_linen_param_with_batch_axis():
    class Experts(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", I.spectral_orthogonal(batch_axis=0), (4, 16, 64))
            return jnp.einsum("bi,eio->beo", x, w)

    w = Experts().init(KEY, jnp.ones((2, 16)))["params"]["w"]
    for s in np_slices(w, (1,), (2,), (0,)):
        np.testing.assert_allclose(sigmas(s), 2.0, rtol=1e-4)


def test_nnx_linear_and_embed():
    rngs = nnx.Rngs(0)
    lin = nnx.Linear(256, 64, kernel_init=I.spectral_orthogonal(gain=1.0), rngs=rngs)
    np.testing.assert_allclose(sigmas(np.asarray(lin.kernel[...], np.float64)), math.sqrt(64 / 256), rtol=1e-4)
    lin16 = nnx.Linear(256, 256, kernel_init=I.spectral_normal(), param_dtype=jnp.bfloat16, rngs=rngs)
    k = lin16.kernel[...]
    assert k.dtype == jnp.bfloat16 and abs(np.asarray(k, np.float64).std() * 16 - 1) < 0.03
    emb = nnx.Embed(500, 128, embedding_init=I.spectral_embedding(std=1.0), rngs=rngs)
    assert abs(np.asarray(emb.embedding[...]).std() - 1) < 0.03


def test_exported_from_package():
    # a fresh interpreter: `import spectral_optax` alone must expose the submodule
    import subprocess
    import sys

    code = "import spectral_optax; print(spectral_optax.initializers.spectral_orthogonal.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "spectral_orthogonal"


# --------------------------------------------------------------------------
# spectral_normalized: any initializer rescaled to the spectral target.
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, kw, axes",
    [
        ((48, 16), {}, ((0,), (1,), ())),
        ((16, 48), {}, ((0,), (1,), ())),
        ((3, 3, 4, 6), {}, ((0, 1, 2), (3,), ())),  # conv: d_in = window x in
        ((5, 12, 10), {"batch_axis": 0}, ((1,), (2,), (0,))),  # 5 stacked matrices
        ((8, 4, 6), {"out_axis": (-2, -1)}, ((0,), (1, 2), ())),  # DenseGeneral (in, heads, head_dim)
    ],
)
def test_spectral_normalized_hits_the_target_per_slice(shape, kw, axes):
    base = jax.nn.initializers.uniform(0.3)  # not Gaussian, not centred: the direction is the base's
    gain = 1.7
    init = I.spectral_normalized(base, gain=gain, **kw)
    key = jax.random.key(3)
    w = np_slices(init(key, shape), *axes)
    w0 = np_slices(base(key, shape, jnp.float32), *axes)
    d_in, d_out = w.shape[1:]
    target = gain * np.sqrt(d_out / d_in)
    for m, m0 in zip(w, w0):
        s0 = np.linalg.svd(m0, compute_uv=False)
        np.testing.assert_allclose(np.linalg.svd(m, compute_uv=False)[0], target, rtol=1e-5)
        np.testing.assert_allclose(m, m0 * target / s0[0], rtol=1e-4, atol=1e-7)  # same direction


def test_spectral_normalized_jit_dtype_flax_and_zeros():
    init = I.spectral_normalized(jax.nn.initializers.orthogonal(), dtype=jnp.bfloat16)
    w = jax.jit(lambda k: init(k, (32, 64)))(jax.random.key(0))
    assert w.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.linalg.svd(np.asarray(w, np.float64), compute_uv=False)[0],
                               np.sqrt(2.0), rtol=1e-2)
    layer = nn.Dense(8, kernel_init=I.spectral_normalized(nn.initializers.lecun_normal()))
    k = layer.init(jax.random.key(1), jnp.ones((1, 20)))["params"]["kernel"]
    np.testing.assert_allclose(np.linalg.svd(np.asarray(k, np.float64), compute_uv=False)[0],
                               np.sqrt(8 / 20), rtol=1e-5)
    z = I.spectral_normalized(jax.nn.initializers.zeros)(jax.random.key(0), (4, 4))
    np.testing.assert_array_equal(z, 0.0)  # no direction to rescale: stays zero, no NaN


def test_spectral_normalized_errors():
    with pytest.raises(TypeError, match="base_init"):
        I.spectral_normalized("lecun_normal")
    init = I.spectral_normalized(jax.nn.initializers.lecun_normal())
    with pytest.raises(ValueError, match="not a matrix"):
        init(jax.random.key(0), (8,))
    nan_init = I.spectral_normalized(lambda k, s, d=jnp.float32: jnp.full(s, jnp.nan, d))
    with pytest.raises(ValueError, match="non-finite"):
        nan_init(jax.random.key(0), (4, 4))
    bad_shape = I.spectral_normalized(lambda k, s, d=jnp.float32: jnp.ones((2, 2), d))
    with pytest.raises(ValueError, match="returned shape"):
        bad_shape(jax.random.key(0), (4, 4))


@pytest.mark.usefixtures("highest_precision")
def test_initializer_shape_errors_name_the_fix():
    """A 0-D embedding shape and a 1-D weight shape: errors say what shape is needed (lowercase argument names)."""
    with pytest.raises(ValueError, match=r"embedding table needs at least one axis, typically \(vocab, features\)"):
        so.initializers.spectral_embedding()(jax.random.key(0), ())
    with pytest.raises(ValueError, match=r"out_axis=\(-2, -1\); stacked \(layers, in, out\): batch_axis=0"):
        so.initializers.spectral_normal()(jax.random.key(0), (4,))
