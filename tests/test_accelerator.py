"""The lab on accelerators, checked on a CPU: bfloat16 models, numerics and budgets by backend.

The GPU/TPU-specific behaviour is reached through seams (the backend query of
the benchmarks is patched), so these tests run, and can fail, on a CPU.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import width_transfer
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


def test_width_transfer_budget_by_backend():
    """On a CPU the quickstart runs Muon at every width of its preset (the CPU limit is the quick preset's widest)
    and the default preset's wider models are skipped for Muon; on an accelerator nothing is skipped; the flag
    wins everywhere."""
    quick = width_transfer.settings("quick", accelerator=False)
    assert quick["muon_max_width"] == max(quick["widths"])
    default = width_transfer.settings("default", accelerator=False)
    assert default["muon_max_width"] < max(default["widths"])
    for preset in ("quick", "default", "gpu"):
        assert width_transfer.settings(preset, accelerator=True)["muon_max_width"] is None
    assert width_transfer.settings("default", accelerator=True, muon_max_width=128)["muon_max_width"] == 128


@pytest.mark.slow
def test_width_transfer_skips_nothing_on_an_accelerator(tmp_path, monkeypatch):
    # On a CPU the quick preset stops Muon at width 256 (settings above).
    monkeypatch.setattr(cli, "on_accelerator", lambda: True)
    out = tmp_path / "w.json"
    width_transfer.main(
        [
            "--quick",
            "--widths",
            "8,260",
            "--steps",
            "2",
            "--num-lrs",
            "2",
            "--optimizers",
            "muon",
            "--data",
            "digits",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    payload = json.loads(out.read_text())
    assert payload["skipped_widths"] == {} and payload["dtype"] == "float32"
    assert sorted(int(w) for w in payload["summary"]["muon"]["best_lr"]) == [8, 260]
