"""benchmarks/third_party_lm.py's quick preset through ``main(argv)``: the JSON's schema, and every number of the
report recomputed from the JSONL runs and ``so.transfer`` (the benchmark itself: docs/benchmarks.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import spectral_optax as so
from benchmarks import third_party_lm
from spectral_optax.lab import third_party

pytestmark = pytest.mark.slow

TARGET_KEYS = {
    "scale", "proxy_lr", "lr", "lr_factor", "account", "naive_lr", "grid", "best_lr", "best_loss", "loss",
    "regret", "regret_steps", "naive_regret", "naive_regret_steps", "per_seed", "at_edge", "adamw_best",
    "vs_adamw", "best_vs_adamw",
}  # fmt: skip


def _mean_at(runs, lr):
    v = [r["train_loss"] for r in runs if math.isclose(r["lr"], lr, rel_tol=1e-9)]
    assert len(v) == 2, (lr, v)  # both seeds
    return float(np.mean(v))


def test_quick_preset_schema_transfer_and_regret_from_the_runs(tmp_path):
    path = tmp_path / "q.json"
    argv = ["--quick", "--out", str(tmp_path), "--json", str(path), "--no-progress"]
    third_party_lm.main(argv)
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "third_party_lm" and doc["preset"] == "quick"
    preset = third_party.PRESETS["quick"]
    (w0, t0, b0), ((w1, t1, b1),) = preset["proxy"], preset["targets"]
    ctx = preset["context"]
    runs = [json.loads(line) for line in (tmp_path / "third_party_lm.jsonl").read_text().splitlines()]
    report = doc["report"]["tied"]
    assert set(report) == set(preset["setups"]) | {third_party.BASELINE}
    adamw_runs = [r for r in runs if r["name"] == third_party.BASELINE and r["size"] == w1]
    adamw_best = min(_mean_at(adamw_runs, lr) for lr in {r["lr"] for r in adamw_runs})
    for name, row in report.items():
        proxy_runs = [r for r in runs if r["name"] == name and r["size"] == w0]
        assert {r["seed"] for r in proxy_runs} == {0, 1}
        # The proxy's LR is its best grid LR by the seed-mean loss, recomputed from the runs.
        lr0 = min(row["proxy"]["grid"], key=lambda lr: _mean_at(proxy_runs, lr))
        assert row["proxy"]["lr"] == pytest.approx(lr0, rel=1e-9)
        (t,) = row["targets"].values()
        assert set(t) == TARGET_KEYS
        # The transferred LR is so.transfer's, for the proxy's best, and the preset's sizes (horizon x batch).
        hand = so.transfer.transfer(
            {"learning_rate": lr0},
            so.transfer.Scale(width=w0, depth=1, steps=t0, batch_size=b0, sequence_length=ctx),
            so.transfer.Scale(width=w1, depth=1, steps=t1, batch_size=b1, sequence_length=ctx),
        )["learning_rate"]
        assert t["lr"] == pytest.approx(hand, rel=1e-9)
        assert t["lr"] / lr0 == pytest.approx((t1 * b1 / (t0 * b0)) ** -0.32 * (b1 / b0) ** 0.62, rel=1e-9)
        assert t["naive_lr"] == pytest.approx(lr0, rel=1e-12)
        # The target's grid is sqrt(2) apart around the transferred LR; it ran both seeds at every grid LR and at
        # the naive one.
        grid = np.asarray(t["grid"])
        assert np.allclose(grid[1:] / grid[:-1], math.sqrt(2), rtol=1e-9)
        assert any(math.isclose(g, t["lr"], rel_tol=1e-9) for g in grid)
        target_runs = [r for r in runs if r["name"] == name and r["size"] == w1]
        assert all(r["steps"] == t1 and r["batch_size"] == b1 for r in target_runs)
        best = min(_mean_at(target_runs, lr) for lr in [*grid, lr0])
        assert t["best_loss"] == pytest.approx(best, abs=1e-9)
        assert t["loss"] == pytest.approx(_mean_at(target_runs, t["lr"]), abs=1e-9)
        assert t["regret"] == pytest.approx(t["loss"] - best, abs=1e-9) and t["regret"] >= -1e-12
        assert t["naive_regret"] == pytest.approx(_mean_at(target_runs, lr0) - best, abs=1e-9)
        assert t["vs_adamw"] == pytest.approx(t["loss"] - adamw_best, abs=1e-9)
        assert t["best_vs_adamw"] == pytest.approx(best - adamw_best, abs=1e-9)
        assert set(t["per_seed"]) == {"0", "1"}
        assert all(math.isfinite(v) for v in (t["regret"], t["regret_steps"], t["best_lr"]))
    # The baseline is compared with itself: its best minus its best.
    assert report[third_party.BASELINE]["targets"][str(w1)]["best_vs_adamw"] == pytest.approx(0.0, abs=1e-12)
    # Resumable: rerunning records nothing new and reports the same numbers.
    again = third_party_lm.main(argv)
    assert len((tmp_path / "third_party_lm.jsonl").read_text().splitlines()) == len(runs)
    assert again["tied"]["muon"]["targets"][w1]["regret"] == pytest.approx(report["muon"]["targets"][str(w1)]["regret"])


def test_the_fixture_is_nanodos_shape_and_the_spectral_setup_reinitializes():
    # nanodo's parameter tree: boxed (FSDP) leaves, no biases, DenseGeneral heads (D, H, Dh) and (H, Dh, D).
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from spectral_optax import lab

    data = lab.load("text", context=16, sequence=True)
    cfg = third_party.config(32, data, tied=True, blocks=2)
    params = third_party.TransformerDo(cfg).init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
    assert isinstance(params["embed"]["embedding"], nn.Partitioned)
    shapes = {"/".join(str(k.key) for k in p[:-1]): v.shape for p, v in jax.tree_util.tree_leaves_with_path(params)}
    assert shapes["blocks_0/CausalAttn_0/query/kernel"] == (32, 2, 16)
    assert shapes["blocks_1/CausalAttn_0/attn_out_proj/kernel"] == (2, 16, 32)
    assert shapes["blocks_0/Mlp_0/Dense_0/kernel"] == (32, 128)
    assert shapes["pos_embed/embedding"] == (16, 32) and shapes["embed/embedding"] == (256, 32)
    assert not any(k.endswith("bias") for k in shapes) and "head/kernel" not in shapes
    own, _ = third_party.make_model(32, data, tied=True, blocks=2, setup=third_party.SETUPS["adamw"])
    spec, _ = third_party.make_model(32, data, tied=True, blocks=2, setup=third_party.SETUPS["muon"])
    table = lambda m: nn.unbox(m.init(jax.random.key(0)))["embed"]["embedding"]  # noqa: E731
    # own init: variance_scaling(1, fan_in over D) = N(0, 1/D); the tied path: N(0, s^2), s = 0.25
    assert float(jnp.std(table(own))) == pytest.approx(32**-0.5, rel=0.1)
    assert float(jnp.std(table(spec))) == pytest.approx(0.25, rel=0.1)
    untied = third_party.TransformerDo(third_party.config(32, data, tied=False, blocks=2))
    head = untied.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]["head"]["kernel"]
    assert head.value.shape == (32, 256)


@pytest.mark.parametrize("tied,setup", [(True, "muon"), (False, "adamw")])
def test_the_nnx_model_is_the_linen_model(tied, setup):
    # The NNX fixture with the Linen fixture's parameters (paths blocks_i/... -> blocks/i/...) gives the same logits
    # through make_model's apply, the tied read-out multiplier (muon's tied path: c / d) included.
    import jax
    from flax import linen as nn
    from flax import nnx

    from spectral_optax import lab

    data = lab.load("text", context=16, sequence=True)
    x, _ = data.numpy_batch("train", np.arange(4))
    kw = dict(tied=tied, blocks=2, setup=third_party.SETUPS[setup])
    linen, _ = third_party.make_model(32, data, **kw)
    model, geometry = third_party.make_model(32, data, framework="nnx", **kw)
    params = nn.unbox(linen.init(jax.random.key(0)))
    flat = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        key = tuple(str(p.key) for p in path)
        if key[0].startswith("blocks_"):
            key = ("blocks", int(key[0].split("_")[1]), *key[1:])
        flat[key] = leaf
    state = model.init(jax.random.key(1))

    def fill(tree, prefix=()):
        return {k: fill(v, (*prefix, k)) if isinstance(v, dict) else flat.pop((*prefix, k)) for k, v in tree.items()}

    nnx.replace_by_pure_dict(state, fill(state.to_pure_dict()))
    assert not flat  # every Linen parameter has its NNX twin
    np.testing.assert_allclose(model.apply(state, x), linen.apply(params, x), rtol=1e-5, atol=1e-5)
    roles = {r["path"]: r["kind"] for r in so.describe(state, geometry, print_table=False)}
    assert roles["embed/embedding"] == ("embedding/output" if tied else "embedding")


def test_moga_study_reports_each_variant_and_its_curve(tmp_path):
    """``--study moga`` through ``main(argv)``: every variant's best LR and loss are its runs' own (JSONL), and the
    curve reported at the best LR is the seed mean of those runs' curves, against tokens seen."""
    out = tmp_path / "out"
    report = third_party_lm.main([
        "--study", "moga", "--untied", "--width", "16", "--steps", "4", "--batch-size", "2", "--seeds", "1",
        "--variants", "tied_path_bf25,published", "--lrs", "*=0.005:0.01", "--no-progress", "--out", str(out),
        "--json", str(tmp_path / "r.json"),
    ])  # fmt: skip
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["study"] == "moga" and saved["tied"] is False
    runs = [json.loads(line) for line in (out / "third_party_lm_diagnose.jsonl").read_text().splitlines()]
    assert {r["name"] for r in runs} == {"tied_path_bf25", "published"}
    for name, r in (report or saved["report"]).items():
        mine = [x for x in runs if x["name"] == name]
        losses = {x["lr"]: x["train_loss"] for x in mine}
        assert r["best_lr"] == min(losses, key=losses.get)
        assert math.isclose(r["best_loss"], min(losses.values()), rel_tol=1e-6)
        at_best = next(x for x in mine if x["lr"] == r["best_lr"])
        np.testing.assert_allclose(r["curve"], at_best["curve"], rtol=1e-6)
        assert r["tokens_per_step"] == 2 * 64
