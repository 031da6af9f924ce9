"""The tied-embedding study: its model, constants and optimizers (``spectral_optax.lab.tied``) against references
written here, and ``benchmarks.tied_transfer``'s command line at a few steps (the benchmark itself:
docs/benchmarks.md)."""

from __future__ import annotations

import functools
import itertools
import json
import math

import jax
import numpy as np
import pytest

import spectral_optax as so
from spectral_optax import lab
from spectral_optax.lab import tied as study


def test_models_start_at_ln_vocab_and_the_tied_one_carries_the_multiplier():
    # The benchmark's 'spectral' tied model is reinitialize + tied_readout(1/d): its initial loss is the uniform
    # predictor's ln(256) (reference computed here); the same params read out without the multiplier are far above.
    data = lab.load("text", context=8, sequence=True)
    x, y = data.numpy_batch("train", np.arange(4))
    model, geometry = study.make_model(64, data, tied=True, init="spectral")
    params = model.init(jax.random.key(0))
    assert abs(float(model.loss(params, x, y)) - math.log(256)) < 0.5
    own, _ = study.make_model(64, data, tied=True, init="own")
    assert float(own.loss(params, x, y)) > math.log(256) + 3.0
    notes = [r["path"] for r in so.describe(params, geometry, print_table=False) if r["note"]]
    assert notes == ["embed/embedding"]


def _tiny_run(tmp_path, *flags):
    """``python -m benchmarks.tied_transfer`` on the tied model at widths 16 and 32, two steps of batch 2, context 8,
    one seed, 16 validation sequences; returns its JSON."""
    from benchmarks import tied_transfer

    path = tmp_path / "tied.json"
    argv = "--quick --models tied --widths 16,32 --steps 2 --seeds 1 --batch-size 2 --context 8 --eval-examples 16"
    tied_transfer.main([*argv.split(), "--out", str(tmp_path), "--no-progress", "--json", str(path), *flags])
    return json.loads(path.read_text())


@pytest.mark.slow
def test_quick_code_path_runs_and_reports(tmp_path, capsys):
    report = _tiny_run(tmp_path, "--optimizers", "muon,adamw_sp", "--num-lrs", "2")
    s = report["summary"]["tied"]
    assert set(s) == {"muon", "adamw_sp"}
    for name in s:
        assert sorted(int(w) for w in s[name]["loss_at_best"]) == [16, 32]
        assert all(math.isfinite(v) for v in s[name]["loss_at_best"].values())
        assert report["regret"]["tied"][name]["wide"] == 32
    assert (tmp_path / "tied_transfer.jsonl").exists()
    assert "muon" in capsys.readouterr().out  # the printed report


def test_tune_grid_constants_tag_and_parse():
    # Every combination of the grid, rb only on the tied model and hb only on the untied one.
    tied = study.tune_grid("moga", tied=True)
    untied = study.tune_grid("moga", tied=False)
    grid = study.TUNE_GRID["moga"]
    # every combination of the grid's values: rb only on the tied model (hb at its default there), hb only on the
    # untied one (rb at its default); each combination once
    defaults = study.DEFAULT_CONSTANTS
    for combos, skip in ((tied, "hb"), (untied, "rb")):
        keys = [k for k in grid if k != skip]
        want = {tuple(v) for v in itertools.product(*(grid[k] for k in keys))}
        assert {tuple(c[k] for k in keys) for c in combos} == want and len(combos) == len(want)
        assert all(c[skip] == defaults[skip] for c in combos)
    assert study.tune_grid("adamw_sp", tied=True) == [study.DEFAULT_CONSTANTS]
    # The resume tag names only what differs from the defaults ("/rb4": the tag of --readout-base-width 4).
    assert study.constants_tag(study.DEFAULT_CONSTANTS) == ""
    assert study.constants_tag(dict(study.DEFAULT_CONSTANTS, rb=4.0, bf=5.0)) == "/rb4/bf5"
    assert study.parse_constants("muon:rb=4:emb=0.25,moga:bf=5") == {
        "muon": {"rb": 4.0, "emb": 0.25},
        "moga": {"bf": 5.0},
    }
    # --constants wins over --readout-base-width (the docstring's "--constants muon:rb=4:emb=4" runs)
    given = study.parse_constants("moga:rb=4:bf=1:adam=1:emb=4")
    assert study.constants_for("moga", 2.0, given) == dict(study.DEFAULT_CONSTANTS, rb=4.0, emb=4.0, bf=1.0, adam=1.0)
    assert study.constants_for("muon", 2.0, given) == dict(study.DEFAULT_CONSTANTS, rb=2.0)
    with pytest.raises(SystemExit, match="KEY one of"):
        study.parse_constants("muon:lr=4")
    with pytest.raises(SystemExit, match="unknown optimizer"):
        study.parse_constants("sgd:rb=4")


@functools.lru_cache(maxsize=1)
def _setup(d=16):
    data = lab.load("text", context=8, sequence=True)
    x, y = data.numpy_batch("train", np.arange(4))
    model, geometry = study.make_model(d, data, tied=True, init="spectral")
    params = model.init(jax.random.key(0))
    return model, geometry, params, jax.grad(model.loss)(params, x, y)


def _one_update(name, consts, d=16):
    model, geometry, params, grads = _setup(d)
    opt = study.optimizer_factory(name, lambda n: geometry, model.shapes(), consts=consts)(0.01, d)
    updates, _ = opt.update(grads, opt.init(params), params)
    return _by_path(updates)


def _by_path(tree):
    """``{'/'-joined path: float64 array}`` of a parameter-shaped tree."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v, np.float64) for path, v in flat}


def _check_scaled(ref, scaled, factor_of):
    for p in ref:
        np.testing.assert_allclose(scaled[p], factor_of(p) * ref[p], rtol=1e-5, atol=1e-12)


TABLES = ("embed/embedding", "pos_embed")


@pytest.mark.slow
def test_moga_constants_scale_their_routes_only():
    # emb = 4: the tied table's and the positions' first updates are 4x those at emb = 1, every other leaf's equal;
    # bf = 5 against the default 25: the hidden matrices' steps x 1/5, the tables' and vectors' sign steps equal.
    ref = _one_update("moga", {})
    assert {p for p in ref if p.endswith(TABLES)} == set(TABLES)
    _check_scaled(ref, _one_update("moga", {"emb": 4.0}), lambda p: 4.0 if p.endswith(TABLES) else 1.0)
    hidden = [p for p in ref if p.endswith("kernel")]
    assert hidden and len(hidden) < len(ref)
    _check_scaled(ref, _one_update("moga", {"bf": 5.0}), lambda p: 0.2 if p in hidden else 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["muon", "mup_adamw"])
def test_emb_multiplies_the_tables_updates_only(name):
    ref = _one_update(name, {})
    _check_scaled(ref, _one_update(name, {"emb": 4.0}), lambda p: 4.0 if p.endswith(TABLES) else 1.0)


@pytest.mark.slow
def test_tune_picks_the_proxy_best_and_transfers_with_it(tmp_path, monkeypatch):
    monkeypatch.setitem(study.TUNE_GRID, "muon", {"rb": (1.0, 4.0)})
    report = _tiny_run(tmp_path, "--optimizers", "muon", "--num-lrs", "3", "--tune")
    rows = report["tuning"]["tied"]["muon"]
    assert sorted(r["rb"] for r in rows) == [1.0, 4.0]
    best = min(rows, key=lambda r: r["loss"])
    assert report["constants"]["tied"]["muon"]["rb"] == best["rb"]
    s = report["summary"]["tied"]["muon"]
    assert s["loss_at_best"]["16"] == pytest.approx(best["loss"])  # the proxy's runs reused, not redrawn
    assert sorted(int(w) for w in s["loss_at_best"]) == [16, 32]


def test_es_sets_the_tables_init_std_only():
    # es = 0.25: the tied table's and the positions' entries are N(0, 0.25^2) (sample std of 256 x 16 and 8 x 16
    # entries, within 4 standard errors), the matrices are drawn as at es = 1.
    data = lab.load("text", context=8, sequence=True)
    ref = study.make_model(16, data, tied=True, init="spectral")[0].init(jax.random.key(0))
    small = study.make_model(16, data, tied=True, init="spectral", embedding_std=0.25)[0].init(jax.random.key(0))
    for table, n in ((small["embed"]["embedding"], 256 * 16), (small["pos_embed"], 8 * 16)):
        assert abs(np.asarray(table, np.float64).std() - 0.25) < 4 * 0.25 / math.sqrt(2 * n)
    np.testing.assert_array_equal(small["block_0"]["mlp_in"]["kernel"], ref["block_0"]["mlp_in"]["kernel"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["muon", "moga"])
def test_norm_puts_every_table_row_at_rms_lr(name):
    # norm = 1: after momentum, every row of the tied table and of the positions is scaled to RMS 1. The first
    # momentum is a multiple of the gradient, so the first update's row is -lr * emb * g_row / RMS(g_row)
    # (reference in float64 NumPy from the gradient; a sign or Adam step is not parallel to g_row). The hidden
    # kernels' updates are those of norm = 0.
    ref = _one_update(name, {})
    grads = _by_path(_setup()[3])
    for emb in (1.0, 4.0):
        upd = _one_update(name, {"norm": 1.0, "emb": emb})
        for p in TABLES:
            g = grads[p].reshape(-1, grads[p].shape[-1])
            want = -0.01 * emb * g / np.sqrt(np.mean(g**2, axis=-1, keepdims=True))
            np.testing.assert_allclose(upd[p].reshape(g.shape), want, rtol=1e-4, atol=1e-9)
        for p in ref:
            if p.endswith("kernel"):
                np.testing.assert_allclose(upd[p], ref[p], rtol=1e-5, atol=1e-12)
