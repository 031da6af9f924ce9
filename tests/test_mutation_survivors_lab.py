"""Tests written for mutants that survived mutation testing of spectral_optax/lab/*.py, nn/*.py, transfer.py and
diagnostics/*.py (see docs/reliability.md, "Mutation testing")."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import spectral_optax as so
from spectral_optax import lab
from spectral_optax import transfer as st
from spectral_optax.lab._models import embed_init, loss_for
from spectral_optax.nn._sharded import gathered_call, rows_sharding

# --------------------------------------------------------------------------
# lab: sweep harness.
# --------------------------------------------------------------------------
from tests.test_sweep import quadratic_family as _quadratic_family


def _closed_form_losses(lr, multipliers):
    """Per-step losses of SGD on the size-2 quadratic: e <- e (1 - lr m(t)), loss = e^2."""
    e, out = -3.0, []
    for m in multipliers:
        out.append(e * e)
        e *= 1.0 - lr * m
    return out


def test_warmup_cosine_values_against_hand_formula():
    """warmup_cosine(20): linear ramp over W=1 step, then final + (1 - final)(1 + cos(pi (t - W)/(steps - W)))/2."""
    steps = 20
    m = lab.warmup_cosine(steps)
    t = np.arange(steps)
    ref = np.where(t < 1, (t + 1) / 1.0, 0.5 * (1 + np.cos(np.pi * np.clip(t - 1, 0, 19) / 19)))
    np.testing.assert_allclose(np.asarray(m(jnp.asarray(t))), ref, rtol=1e-6, atol=1e-7)
    m2 = lab.warmup_cosine(steps, warmup=0.2, final=0.1)
    ref2 = np.where(t < 4, (t + 1) / 4.0, 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * np.clip(t - 4, 0, 16) / 16)))
    np.testing.assert_allclose(np.asarray(m2(jnp.asarray(t))), ref2, rtol=1e-6, atol=1e-7)


def test_sweep_records_schedule_on_a_mesh_and_resumes_by_schedule(tmp_path):
    """A (lr, size) factory on a one-device 'runs' mesh with warmup_cosine matches SGD's closed form, records the
    schedule name, no val_curve by default; the file reads back, and a constant-schedule rerun trains anew."""
    data = lab.digits_binary()
    path = str(tmp_path / "runs.jsonl")
    kw = dict(steps=4, batch_size=2, results=path, progress=False, chunks=2, curve_points=4)
    res = lab.sweep(
        _quadratic_family, lambda lr, n: optax.sgd(lr), [2], [0.1], data, schedule="warmup_cosine", devices=1, **kw
    )
    (rec,) = res.runs
    assert rec["schedule"] == "warmup_cosine"
    assert "val_curve" not in rec and "val_curve_steps" not in rec
    # steps=4: W = 1, decay = 3: m = 1, 1, (1 + cos(pi/3))/2, (1 + cos(2 pi/3))/2
    want = _closed_form_losses(0.1, [1.0, 1.0, 0.75, 0.25])
    np.testing.assert_allclose(rec["curve"], want, rtol=1e-5)
    np.testing.assert_allclose(rec["train_loss"], want[-1], rtol=1e-5)
    loaded = lab.load_runs(path)
    assert len(loaded) == 1 and loaded[0]["lr"] == 0.1 and loaded[0]["schedule"] == "warmup_cosine"
    again = lab.sweep(_quadratic_family, lambda lr, n: optax.sgd(lr), [2], [0.1], data, **kw)
    (rec2,) = again.runs
    assert rec2["schedule"] == "constant"
    np.testing.assert_allclose(rec2["curve"], _closed_form_losses(0.1, [1.0] * 4), rtol=1e-5)
    assert len(lab.load_runs(path)) == 2


def test_sweep_refuses_a_seed_outside_uint32():
    """A seed that does not fit the uint32 PRNG seed is refused instead of silently aliasing another seed."""
    data = lab.digits_binary()
    with pytest.raises(OverflowError):
        lab.sweep(_quadratic_family, optax.sgd, [2], [0.1], data, steps=2, batch_size=2, seeds=(2**32,), progress=False)


# --------------------------------------------------------------------------
# lab: summary.
# --------------------------------------------------------------------------
def test_refine_minimum_all_diverged_and_tied_neighbour():
    """Every run diverged: (nan, -1); a right neighbour tied with the minimum puts the vertex at exactly +h/2."""
    best, i = lab.refine_minimum([1.0, 2.0, 4.0], [np.nan, np.inf, np.nan])
    assert math.isnan(best) and i == -1
    y = [6.369616873214543e-08, 4.097352393619469e-09, 4.097352393619469e-09]
    best, i = lab.refine_minimum([1.0, 2.0, 4.0], y)
    u = np.log(np.array([1.0, 2.0, 4.0]))
    h = 0.5 * (u[2] - u[0])
    assert i == 1 and best == float(np.exp(u[1] + h / 2))


# --------------------------------------------------------------------------
# lab: data.
# --------------------------------------------------------------------------
def test_text_too_short_errors_name_the_source_and_needed_size(tmp_path):
    """The too-short error names the file (or 'the embedded text') and the bytes needed, 2 (T + 1) / min(f, 1-f) + 1."""
    p = tmp_path / "short.txt"
    p.write_bytes(b"0123456789")
    with pytest.raises(lab.DataError, match=r"short\.txt' has 10 bytes.*at least 181 bytes"):
        lab.text(str(p), context=8, val_fraction=0.1)
    with pytest.raises(lab.DataError, match=r"text: the embedded text has \d+ bytes, too short for context=100000"):
        lab.text(context=100000)


def test_text_dataset_name_says_seq_for_sequence(tmp_path):
    """text(sequence=True) is named 'seq:<file>', text() 'text:<file>'."""
    p = tmp_path / "long.txt"
    p.write_bytes(bytes(range(32, 127)) * 4)
    assert lab.text(str(p), context=4, sequence=True).name == "seq:long.txt"
    assert lab.text(str(p), context=4).name == "text:long.txt"


def _write_cifar10(root):
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)

    def recs(labels):
        return np.stack([np.concatenate([[lab_], rng.integers(0, 256, 3072)]).astype(np.uint8) for lab_ in labels])

    for b in range(1, 6):
        recs([b % 10, (b + 3) % 10]).tofile(os.path.join(root, f"data_batch_{b}.bin"))
    recs([7, 9, 0]).tofile(os.path.join(root, "test_batch.bin"))


def test_load_cifar10_spec_gives_ten_classes_flattened_by_default(tmp_path):
    """load('cifar10:DIR') reads 10 classes with flat (3072,) inputs by default, (32, 32, 3) with flatten=False."""
    _write_cifar10(str(tmp_path))
    ds = lab.load(f"cifar10:{tmp_path}")
    assert ds.num_outputs == 10 and ds.input_shape == (3072,) and ds.num_train == 10 and ds.num_val == 3
    assert lab.load(f"cifar10:{tmp_path}", flatten=False).input_shape == (32, 32, 3)


# --------------------------------------------------------------------------
# lab: models.
# --------------------------------------------------------------------------
def test_standard_embed_init_has_std_one_over_sqrt_features():
    """embed_init('standard') draws a (vocab, features) table with std 1/sqrt(features)."""
    table = np.asarray(embed_init("standard")(jax.random.key(0), (512, 64), jnp.float32), np.float64)
    assert abs(table.std() / (1 / 8.0) - 1) < 0.05 and abs(table.mean()) < 0.01


def test_mse_loss_is_half_squared_difference():
    """loss_for('mse') = 0.5 (f - y)^2 per example, f reshaped to y."""
    f = jnp.array([[1.0], [2.0], [-1.0]])
    y = jnp.array([3.0, 2.0, 1.0])
    np.testing.assert_allclose(np.asarray(loss_for("mse")(f, y)), [2.0, 0.0, 2.0], rtol=0, atol=0)


# --------------------------------------------------------------------------
# transfer.
# --------------------------------------------------------------------------
def test_transfer_weight_decay_zero_allowed_negative_refused():
    """weight_decay=0 passes the positivity check, a negative one raises naming hparams['weight_decay']."""
    proxy = st.Scale(width=64, depth=2, steps=1000, batch_size=32, sequence_length=128)
    target = st.Scale(width=512, depth=8, steps=8000, batch_size=128, sequence_length=128)
    out = st.transfer({"learning_rate": 0.01, "weight_decay": 0.0}, proxy, target)
    assert out is not None
    with pytest.raises(ValueError, match=r"hparams\['weight_decay'\] must be a finite positive number"):
        st.transfer({"learning_rate": 0.01, "weight_decay": -0.1}, proxy, target)


def test_horizon_rule_error_names_the_proxy():
    """The horizon rule without the proxy's tokens says the proxy needs steps and batch_size, and how to opt out."""
    target = st.Scale(width=512, depth=8, steps=8000, batch_size=128, sequence_length=128)
    rule = st.horizon()
    with pytest.raises(ValueError, match=r"'horizon' needs proxy's steps and batch_size.*rules=\{'horizon': None\}"):
        rule.fn({"learning_rate": 0.01}, {"learning_rate": 0.01}, st.Scale(width=64), target)


# --------------------------------------------------------------------------
# diagnostics.
# --------------------------------------------------------------------------
def test_init_alignment_is_scale_invariant_for_small_weights():
    """alignment = mean ||x W|| / (||W||_2 ||x||) against float64 NumPy, also for a weight of scale 1e-3."""
    rng = np.random.default_rng(0)
    w = 1e-3 * rng.standard_normal((4, 6))
    x = rng.standard_normal((5, 4))
    ref = np.mean(np.linalg.norm(x @ w, axis=-1) / (np.linalg.svd(w, compute_uv=False)[0] * np.linalg.norm(x, axis=-1)))
    got = so.diagnostics.init_alignment(jnp.asarray(w, jnp.float32), jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(float(got["alignment"][0]), ref, rtol=1e-4)


def test_mlp_batch_gradient_keeps_float32_under_x64():
    """With x64 on, float32 inputs give float32 weights and a float32 gradient."""
    with jax.enable_x64(True):
        x = jnp.ones((3, 4), jnp.float32)
        g = so.diagnostics.mlp_batch_gradient(x, width=8, key=jax.random.key(0))
        assert g.dtype == jnp.float32 and g.shape == (8, 8)


# --------------------------------------------------------------------------
# nn.
# --------------------------------------------------------------------------
def test_nnx_fused_attention_sows_max_logits_by_name():
    """FusedSelfAttention(record_max_logits=True) sows 'max_logits' of shape (num_heads,)."""
    m = so.nn.nnx.FusedSelfAttention(8, 2, record_max_logits=True, rngs=nnx.Rngs(0))
    _, inter = nnx.capture(m, nnx.Intermediate)(jnp.ones((1, 3, 8)))
    (leaf,) = jax.tree.leaves(inter["max_logits"])
    assert leaf.shape == (2,)


def test_nnx_transformer_uses_embedding_init():
    """Transformer(embedding_init=...) initializes the token embedding with it."""
    m = so.nn.nnx.Transformer(
        11, 8, 1, 2, max_len=4, scan=False, embedding_init=nnx.initializers.ones, rngs=nnx.Rngs(0)
    )
    np.testing.assert_array_equal(np.asarray(m.embed.embedding[...]), np.ones((11, 8)))
    np.testing.assert_array_equal(np.asarray(m.pos_embed.embedding[...]), np.ones((4, 8)))


def _explicit_mesh():
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:1])


def test_rows_sharding_appends_a_replicated_feature_axis():
    """On an Explicit mesh rows_sharding is ids' spec then None for the features."""
    mesh = _explicit_mesh()
    with jax.set_mesh(mesh):
        ids = jax.device_put(jnp.arange(4), P("data"))
        table = jax.device_put(jnp.ones((8, 3)), P("data", None))
        assert tuple(rows_sharding(table, ids)) == ("data", None)


def test_gathered_call_with_sharded_params_matches_numpy_and_restores():
    """gathered_call on an Explicit mesh with a sharded kernel gives x W + b and leaves the kernel sharded."""
    mesh = _explicit_mesh()
    lin = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    w, b = np.asarray(lin.kernel[...], np.float64), np.asarray(lin.bias[...], np.float64)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    with jax.set_mesh(mesh):
        lin.kernel.set_value(jax.device_put(lin.kernel[...], P("data", None)))
        y = gathered_call(lin, jnp.asarray(x))
        assert tuple(jax.typeof(lin.kernel[...]).sharding.spec) == ("data", None)
    np.testing.assert_allclose(np.asarray(y), x @ w + b, rtol=1e-5, atol=1e-6)
