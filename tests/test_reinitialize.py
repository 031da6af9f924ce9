"""``initializers.reinitialize``: Parametrization 1 for a whole tree, from its geometry.

References are float64 NumPy written here: the canonical ``(slices, d_in,
d_out)`` view built by hand from the truth axes, singular values by
``np.linalg.svd``, entry standard deviations against the formula.
"""

import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import xla_flags
from test_trace_geometry import (
    GPT2,
    TOKENS,
    Classifier,
    GemmaLinen,
    ScanStack,
    gemma_linen_truth,
    gpt2_truth,
)

import spectral_optax as so
from spectral_optax import GeometryMap
from spectral_optax.initializers import reinitialize


def slices64(x, fan_in, fan_out, splits=1):
    """(slices, d_in, d_out) in float64, from the axes (independent of spectral_optax.expert.to_matrix)."""
    x = np.asarray(x, np.float64)
    batch = [a for a in range(x.ndim) if a not in fan_in and a not in fan_out]
    y = np.transpose(x, batch + list(fan_in) + list(fan_out))
    nb = int(np.prod([x.shape[a] for a in batch]))
    d_in = int(np.prod([x.shape[a] for a in fan_in]))
    d_out = int(np.prod([x.shape[a] for a in fan_out])) // splits
    y = y.reshape(nb, d_in, splits, d_out).transpose(0, 2, 1, 3)
    return y.reshape(nb * splits, d_in, d_out)


def flat(tree):
    return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in p): x
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}  # fmt: skip


def check_tree(old, new, truth, gain=1.0, method="orthogonal"):
    old, new = flat(old), flat(new)
    for path, (kind, fi, fo, _, splits, _) in truth.items():
        x = new[path]
        assert x.dtype == old[path].dtype and x.shape == old[path].shape, path
        if kind == "vector":
            np.testing.assert_array_equal(np.asarray(x), np.asarray(old[path]), err_msg=path)
            continue
        if kind == "embedding":
            std = np.asarray(x, np.float64).std()
            assert abs(std - 1.0) < 6 / math.sqrt(2 * x.size), (path, std)  # 6 sigma of a sample std
            continue
        m = slices64(x, fi, fo, splits)
        d_in, d_out = m.shape[1:]
        target = gain * math.sqrt(d_out / d_in)
        if method == "orthogonal":
            s = np.linalg.svd(m, compute_uv=False)  # every singular value of every slice
            np.testing.assert_allclose(s, target, rtol=2e-5, err_msg=path)
        else:
            sigma = gain / math.sqrt(d_in) * min(1.0, math.sqrt(d_out / d_in))
            assert abs(m.std() / sigma - 1) < 6 / math.sqrt(2 * m.size), path
            top = np.linalg.svd(m, compute_uv=False)[:, 0] / target
            # Random-matrix theory: ||W|| ~ sigma (sqrt(d_in) + sqrt(d_out)), 1x-2x the target; over seeds
            # 0-9 of these shapes (>= 8 x 8) the ratio stayed in [0.93, 2.0].
            assert np.all((top > 0.75) & (top < 2.3)), (path, top)
        # Stacked slices and fused blocks are independent draws.
        if m.shape[0] > 1:
            c = np.corrcoef(m.reshape(m.shape[0], -1))
            assert np.max(np.abs(c - np.eye(len(c)))) < 0.5, path


@pytest.mark.parametrize("method", ["orthogonal", "normal"])
def test_gpt2_fixture_per_slice_and_per_block(method):
    model = GPT2()
    params = model.init(jax.random.key(0), TOKENS)["params"]
    params = jax.tree.map(lambda x: x + 0.5, params)  # nonzero vectors: must come back unchanged
    new = reinitialize(jax.random.key(1), params, GeometryMap.from_linen(model, TOKENS), method=method)
    check_tree(params, new, gpt2_truth(), method=method)
    # c_attn (72, 24) stored (features, in): three 24 x 24 blocks, each with singular values 1.
    if method == "orthogonal":
        k = np.asarray(new["h"]["0"]["attn"]["c_attn"]["kernel"], np.float64)
        for blk in np.split(k, 3, axis=0):
            np.testing.assert_allclose(np.linalg.svd(blk.T, compute_uv=False), 1.0, rtol=2e-5)


def test_gemma_convlocal_and_scan_fixtures():
    model = GemmaLinen()
    params = model.init(jax.random.key(0), TOKENS)["params"]
    new = reinitialize(jax.random.key(2), params, GeometryMap.from_linen(model, TOKENS), method="orthogonal")
    check_tree(params, new, gemma_linen_truth())
    # key and value of kv_einsum are independent draws, each (D, K*H) = (32, 16) at the target.
    kv = np.asarray(new["layer_0_attn"]["kv_einsum"]["w"], np.float64)
    assert not np.allclose(kv[0], kv[1])

    x = jnp.ones((2, 8, 8, 3))
    cls = Classifier()
    p = cls.init(jax.random.key(0), x)["params"]
    new = reinitialize(jax.random.key(3), p, GeometryMap.from_linen(cls, x), gain=math.sqrt(2), method="orthogonal")
    m = slices64(new["ConvLocal_0"]["kernel"], (2,), (3,))
    assert m.shape == (64, 27, 4)  # one matrix per output position
    np.testing.assert_allclose(np.linalg.svd(m, compute_uv=False), math.sqrt(2) * math.sqrt(4 / 27), rtol=2e-5)

    stack = ScanStack()
    xs = jnp.ones((2, 32))
    p = stack.init(jax.random.key(0), xs)["params"]
    new = reinitialize(jax.random.key(4), p, GeometryMap.from_linen(stack, xs))
    m = slices64(new["trunk"]["fc1"]["kernel"], (1,), (2,))  # (5, 16, 24): five layers
    sigma = 1 / math.sqrt(16)
    for layer in m:
        assert abs(layer.std() / sigma - 1) < 6 / math.sqrt(2 * layer.size)


def test_package_transformer_matches_the_per_layer_rule():
    model = so.nn.linen.Transformer(vocab_size=64, features=32, num_heads=4, num_blocks=2, max_len=8, qkv="fused")
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.key(0), tokens)["params"]
    gmap = GeometryMap.from_linen(model, tokens)
    new = reinitialize(jax.random.key(5), params, gmap, method="orthogonal")
    truth = {}
    for path, g in gmap.leaves(params):
        truth[path] = (g.kind, g.fan_in_axes, g.fan_out_axes, g.batch_axes, g.fan_out_splits, g.role)
    # The layouts the per-layer initializers are given for this model, written out by hand.
    assert truth["blocks/attn/qkv/kernel"][:5] == ("matrix", (1,), (2,), (0,), 3)
    assert truth["blocks/attn/out/kernel"][:4] == ("matrix", (1, 2), (3,), (0,))
    assert truth["head/kernel"][0::5] == ("matrix", "output")
    check_tree(params, new, truth)


def test_dtypes_kept_undecided_unchanged_and_bad_method():
    params = {"Dense_0": {"kernel": jnp.ones((8, 4), jnp.bfloat16)}, "w": jnp.ones((3, 4, 5))}
    with pytest.warns(so.GeometryWarning, match="'w'"):
        new = reinitialize(jax.random.key(0), params)
    assert new["Dense_0"]["kernel"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(new["w"]), 1.0)  # element-wise (undecided): unchanged
    # Deterministic per path: the same key gives the same draw whatever else the tree holds.
    alone = reinitialize(jax.random.key(0), {"Dense_0": {"kernel": jnp.ones((8, 4), jnp.bfloat16)}})
    np.testing.assert_array_equal(np.asarray(alone["Dense_0"]["kernel"]), np.asarray(new["Dense_0"]["kernel"]))
    with pytest.raises(ValueError, match="method must be"):
        reinitialize(jax.random.key(0), params, method="xavier")


def test_shardings_kept_on_two_devices():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from spectral_optax.initializers import reinitialize
        mesh = jax.make_mesh((2,), ("x",))
        s = NamedSharding(mesh, P(None, "x"))
        params = {"Dense_0": {"kernel": jax.device_put(jnp.ones((8, 6)), s), "bias": jnp.zeros(6)}}
        new = reinitialize(jax.random.key(0), params)
        assert new["Dense_0"]["kernel"].sharding == s, new["Dense_0"]["kernel"].sharding
        print("ok")
        """
    )
    env = {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2"), "JAX_PLATFORMS": "cpu"}

    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_reinitialize_on_a_tied_decoder_warns_and_the_guides_path_gives_ln_vocab():
    """Never silent: on a tied decoder (nanodo's shapes) ``reinitialize`` names the tied table,
    ``tied_readout`` and the multiplier; the guide's path then starts at ``ln(vocab)``, the model's
    own ``apply`` without the multiplier far above it."""
    from _lm_fixtures import TiedDecoder, UntiedDecoder
    from test_tied_embeddings import VOCAB, _loss, _setup

    d = 64
    model, x, params, geometry = _setup(TiedDecoder, d)
    with pytest.warns(UserWarning, match=rf"(?s)'embed/embedding' is a tied table.*{1 / d:.4g}.*tied_readout\("):
        redrawn = reinitialize(jax.random.key(2), params, geometry)
    assert _loss(model.apply({"params": redrawn}, x), x) > math.log(VOCAB) + 2.0  # the silent failure
    c = 4.0  # the guide's starting value for muon
    redrawn = reinitialize(jax.random.key(2), params, geometry, embedding_std=0.25, warn_tied=False)
    m = so.initializers.tied_readout_multiplier(redrawn, geometry, base_width=c)
    assert m == pytest.approx(c / d)
    with so.initializers.tied_readout(m):
        assert abs(_loss(model.apply({"params": redrawn}, x), x) - math.log(VOCAB)) < 0.5
    # an untied decoder has no tied table: no warning
    model, x, params, geometry = _setup(UntiedDecoder, d)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        reinitialize(jax.random.key(2), params, geometry)
