"""The lab on accelerators, checked on a CPU: bfloat16 models, numerics and budgets by backend.

The GPU/TPU-specific behaviour is reached through a seam (``lab.cli.on_accelerator``, the backend query of
the benchmarks, is patched), so these tests run, and can fail, on a CPU.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_optax import lab
from spectral_optax.lab import cli


def _relu(x):
    return np.maximum(x, 0.0)


def test_mlp_compute_dtype_bf16_with_f32_params():
    x = np.random.default_rng(0).normal(size=(5, 12)).astype(np.float32)
    f32 = lab.MLP(width=16, depth=2, num_outputs=3)
    bf16 = lab.MLP(width=16, depth=2, num_outputs=3, compute_dtype=jnp.bfloat16)
    params = f32.init(jax.random.key(0), x)["params"]
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(bf16.init(jax.random.key(0), x)))
    # Every matmul of the bf16 model takes bfloat16 operands.
    jaxpr = jax.make_jaxpr(lambda p: bf16.apply({"params": p}, x))(params)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 4 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
    # float64 NumPy reference of relu(W_in x) -> 2 x relu(W h) -> head.
    k = {name: np.asarray(v["kernel"], np.float64) for name, v in params.items()}
    h = _relu(x.astype(np.float64) @ k["Dense_in"])
    for i in range(2):
        h = _relu(h @ k[f"Dense_{i}"])
    ref = h @ k["head"]
    with jax.default_matmul_precision("highest"):
        out32 = np.asarray(f32.apply({"params": params}, x), np.float64)
    out16 = np.asarray(bf16.apply({"params": params}, x).astype(jnp.float32), np.float64)
    scale = np.abs(ref).max()
    assert np.abs(out32 - ref).max() < 1e-5 * scale
    err16 = np.abs(out16 - ref).max()
    assert 1e-4 * scale < err16 < 5e-2 * scale  # really bfloat16, and still the same function


def test_lab_numerics():
    model_dtype, ns_dtype, ctx = cli.lab_numerics("float32")
    assert model_dtype is None and ns_dtype == jnp.float32
    with ctx():
        assert jax.config.jax_default_matmul_precision == "highest"
    with ctx():  # a fresh context manager every time (one per sweep)
        pass
    model_dtype, ns_dtype, ctx = cli.lab_numerics("bfloat16")
    assert model_dtype == jnp.bfloat16 and ns_dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        cli.lab_numerics("float16")


@pytest.mark.slow
@pytest.mark.parametrize(
    "accelerator, widths, flag, skipped",
    [
        (True, "8,520", [], {}),  # on an accelerator nothing is skipped
        (False, "8,520", [], {"muon": [520]}),  # on a CPU Muon stops at 512 (the quick preset's widest)
        (True, "8,16", ["--muon-max-width", "8"], {"muon": [16]}),  # the flag wins everywhere
    ],
    ids=["accelerator", "cpu", "flag"],
)
def test_width_transfer_muon_budget_by_backend(tmp_path, monkeypatch, accelerator, widths, flag, skipped):
    """The quickstart's Muon budget as its JSON reports it (``skipped_widths``, the widths Muon was trained at)."""
    from benchmarks import width_transfer

    monkeypatch.setattr(cli, "on_accelerator", lambda: accelerator)
    out = tmp_path / "w.json"
    argv = ["--quick", "--widths", widths, "--steps", "2", "--num-lrs", "2", "--seeds", "1", "--optimizers", "muon"]
    width_transfer.main(argv + flag + ["--data", "digits", "--out", str(tmp_path), "--no-progress", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert payload["skipped_widths"] == skipped and payload["dtype"] == "float32"
    trained = [int(w) for w in widths.split(",") if int(w) not in skipped.get("muon", [])]
    assert sorted(int(w) for w in payload["summary"]["muon"]["best_lr"]) == trained
