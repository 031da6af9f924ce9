"""LR sweep harness: spread on synthetic curves, a tiny vmapped sweep, resume."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import spectral_optax as so
from spectral_optax import lab
from spectral_optax.lab import Model


# --------------------------------------------------------------------------
# Spread / refinement on synthetic curves.
# --------------------------------------------------------------------------
def test_refine_minimum_recovers_parabola_vertex():
    grid = np.array(lab.lr_grid(1e-2, 10))
    for true_log2 in (-7.3, -6.64, -6.0):  # sub-grid optima
        losses = 2.0 + 0.3 * (np.log2(grid) - true_log2) ** 2
        best, i = lab.refine_minimum(grid, losses)
        np.testing.assert_allclose(np.log2(best), true_log2, atol=1e-9)
        assert grid[i] == grid[np.argmin(losses)]


def test_refine_minimum_edges_and_divergence():
    grid = [1.0, 2.0, 4.0, 8.0]
    assert lab.refine_minimum(grid, [1.0, 2.0, 3.0, 4.0]) == (1.0, 0)  # edge: grid point
    # neighbour diverged: no parabola through inf
    assert lab.refine_minimum(grid, [3.0, 2.0, 1.0, np.nan]) == (4.0, 2)
    best, i = lab.refine_minimum(grid, [np.inf] * 4)
    assert np.isnan(best) and i == -1


def _runs(optima_log2, grid, seeds=(0, 1), diverge_above=None):
    runs = []
    for size, opt in optima_log2.items():
        for seed in seeds:
            for lr in grid:
                div = diverge_above is not None and lr > diverge_above
                loss = 1.0 + (np.log2(lr) - opt) ** 2 + 0.01 * seed
                runs.append(dict(size=size, seed=seed, lr=lr, train_loss=None if div else loss,
                                 val_loss=None if div else loss, diverged=div))
    return runs


def test_spread_on_synthetic_curves():
    grid = lab.lr_grid(0.1, 10)
    optima = {64: np.log2(0.1), 256: np.log2(0.1) + 0.5, 1024: np.log2(0.1) + 1.5}
    s = lab.summarize(_runs(optima, grid))
    np.testing.assert_allclose(s["spread_steps"], 1.5, atol=1e-9)
    np.testing.assert_allclose(np.log2(s["best_lr"][256]), optima[256], atol=1e-9)
    assert s["grid_ratio"] == pytest.approx(2.0)
    np.testing.assert_allclose(s["loss_at_best"][64], 1.005)  # mean over seeds at grid min
    # a factor-4 grid halves the spread in grid steps
    grid4 = [0.1 * 4.0**k for k in range(-4, 4)]
    s4 = lab.summarize(_runs({1: -3.0, 2: 1.0}, grid4))
    assert s4["grid_ratio"] == pytest.approx(4.0)
    np.testing.assert_allclose(s4["spread_steps"], 2.0, atol=1e-9)
    assert lab.spread_steps([0.1]) == 0.0


def test_diverged_runs_counted_not_dropped():
    grid = lab.lr_grid(0.1, 8)
    runs = _runs({8: np.log2(0.1)}, grid, diverge_above=0.5)
    s = lab.summarize(runs)
    assert s["num_runs"] == len(runs) == 16
    assert s["diverged"][8] == 2 * sum(lr > 0.5 for lr in grid)
    np.testing.assert_allclose(s["best_lr"][8], 0.1, rtol=1e-9)
    # one diverged seed makes that (size, lr) diverged
    runs[0]["diverged"], runs[0]["train_loss"] = True, None
    assert lab.summarize(runs)["diverged"][8] == s["diverged"][8] + 1


# --------------------------------------------------------------------------
# A tiny vmapped sweep against a closed form.
# --------------------------------------------------------------------------
def quadratic_family(size):
    """loss = sum((p - 3)^2) / size, p0 = 0: SGD has a closed form."""

    def init(key):
        return {"p": jnp.zeros((size,), jnp.float32)}

    def apply(params, x):
        return params["p"]

    def loss(params, x, y):
        return jnp.sum((params["p"] - 3.0) ** 2) / size

    return Model(init, apply, loss)


def test_vmapped_sweep_matches_closed_form(tmp_path):
    data = lab.digits_binary()
    steps, lrs = 20, [0.01, 0.05, 0.1, 1e30]
    res = lab.sweep(quadratic_family, lambda lr: optax.sgd(lr), [1, 2], lrs, data, steps=steps,
                    batch_size=4, results=tmp_path / "r.jsonl", progress=False, name="q")
    assert len(res.runs) == 8
    for r in res.runs:
        # p_t = 3 (1 - (1 - 2 lr / size)^t); the loss before step t is 9 (1 - 2 lr / size)^(2t)
        if r["lr"] > 1:
            assert r["diverged"] and r["train_loss"] is None
        else:
            c = 1 - 2 * r["lr"] / r["size"]
            expect = 9 * c ** (2 * (steps - 1))
            assert not r["diverged"]
            np.testing.assert_allclose(r["train_loss"], expect, rtol=2e-4, atol=1e-9)
            np.testing.assert_allclose(r["initial_loss"], 9.0, rtol=1e-6)
            np.testing.assert_allclose(r["val_loss"], 9 * c ** (2 * steps), rtol=2e-4, atol=1e-12)
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 8 and all(json.loads(line)["name"] == "q" for line in lines)


@pytest.mark.slow
def test_tiny_mlp_sweep_and_plot(tmp_path):
    data = lab.digits()
    fam = lab.mlp_family(data, vary="width", depth=1, init="spectral")
    res = lab.sweep(fam, lambda lr, n: optax.adam(lr), [8, 16], lab.lr_grid(1e-2, 3), data,
                    steps=10, batch_size=16, seeds=[0, 1], progress=True, size_name="width")
    assert len(res.runs) == 2 * 3 * 2
    assert all(np.isfinite(r["train_loss"]) and r["train_loss"] < r["initial_loss"] + 1
               for r in res.runs)
    # different seeds give different runs, the same seed is reproducible
    a = [r["train_loss"] for r in res.runs if r["size"] == 8 and r["lr"] == res.runs[0]["lr"]]
    assert a[0] != a[1]
    s = res.summary()
    assert set(s["best_lr"]) == {8, 16} and s["metric"] == "train_loss"
    res.plot(tmp_path / "s.png")
    lab.plot_sweeps({"adam": res, "again": res.runs}, tmp_path / "all.png")
    assert (tmp_path / "s.png").stat().st_size > 1000 and (tmp_path / "all.png").exists()


# --------------------------------------------------------------------------
# Resume after an interruption.
# --------------------------------------------------------------------------
class Interrupt(BaseException):
    pass


def test_resume_after_interruption(tmp_path):
    data = lab.digits_binary()
    path = tmp_path / "r.jsonl"
    calls = []

    def family(size, fail_at=None):
        calls.append(size)
        if size == fail_at:
            raise Interrupt()
        return quadratic_family(size)

    kw = dict(steps=5, batch_size=2, seeds=[0, 1], results=path, progress=False, name="q")
    lrs = [0.01, 0.02]
    with pytest.raises(Interrupt):
        lab.sweep(lambda n: family(n, fail_at=2), optax.sgd, [1, 2, 3], lrs, data, **kw)
    first = path.read_text().splitlines()
    assert len(first) == 4 and calls == [1, 2]  # size 1 finished and recorded
    # a kill in the middle of a write leaves a partial line
    with open(path, "a") as f:
        f.write('{"name": "q", "size": 2, "se')
    calls.clear()
    with pytest.warns(UserWarning, match="malformed"):
        res = lab.sweep(family, optax.sgd, [1, 2, 3], lrs, data, **kw)
    assert calls == [2, 3]  # size 1 is not redone
    assert len(res.runs) == 12
    lines = path.read_text().splitlines()
    assert lines[:4] == first  # nothing lost or rewritten
    recs = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
    keys = [(r["size"], r["seed"], r["lr"]) for r in recs]
    assert len(keys) == len(set(keys)) == 12
    calls.clear()
    with pytest.warns(UserWarning):
        again = lab.sweep(family, optax.sgd, [1, 2, 3], lrs, data, **kw)
    assert calls == [] and len(again.runs) == 12
    # a different configuration (more steps) is a different run
    with pytest.warns(UserWarning):
        more = lab.sweep(family, optax.sgd, [1], lrs, data, **dict(kw, steps=6))
    assert calls == [1] and len(more.runs) == 4


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    """A real kill -9 in the middle of a sweep, then a rerun."""
    path = tmp_path / "r.jsonl"
    (tmp_path / "t.txt").write_text("some text to train on. " * 10)
    script = textwrap.dedent(f"""
        import os, signal, sys
        import jax.numpy as jnp, optax
        from spectral_optax import lab
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_sweep import quadratic_family
        def family(size):
            if size == 3 and os.environ.get("KILL"):
                os.kill(os.getpid(), signal.SIGKILL)
            return quadratic_family(size)
        data = lab.text({str(tmp_path / "t.txt")!r}, context=2)
        res = lab.sweep(family, optax.sgd, [1, 2, 3], [0.01, 0.1], data, steps=4,
                        batch_size=2, results={str(path)!r}, progress=False)
        print("RUNS", len(res.runs))
    """)
    env = dict(os.environ, KILL="1", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert p.returncode == -9, p.stderr[-2000:]
    assert len(path.read_text().splitlines()) == 4
    env.pop("KILL")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "RUNS 6" in p.stdout, p.stderr[-2000:]
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) == 6 and len({(r["size"], r["lr"]) for r in recs}) == 6


def _warmup_cosine_np(steps, warmup=0.05):
    """The schedule written out in NumPy (float64), independent of lab.warmup_cosine."""
    w = max(1, round(warmup * steps))
    t = np.arange(steps, dtype=np.float64)
    cos = 0.5 * (1 + np.cos(np.pi * (t - w) / (steps - w)))
    return np.where(t < w, (t + 1) / w, cos)


def test_warmup_cosine_schedule_matches_closed_form_and_records_val(tmp_path):
    data = lab.digits_binary()
    steps, lrs = 40, [0.05, 0.2]
    m = _warmup_cosine_np(steps)
    assert m[0] == 0.5 and m.max() == 1.0 and abs(m[-1] - 0.5 * (1 + np.cos(np.pi * 37 / 38))) < 1e-12
    np.testing.assert_allclose(np.asarray(jax.vmap(lab.warmup_cosine(steps))(jnp.arange(steps))), m,
                               rtol=1e-6, atol=1e-7)
    path = tmp_path / "s.jsonl"
    res = lab.sweep(quadratic_family, lambda lr: optax.sgd(lr), [1, 2], lrs, data, steps=steps,
                    batch_size=4, results=path, progress=False, name="q", schedule="warmup_cosine",
                    val_curve=True, chunks=4)
    assert len(res.runs) == 4
    for r in res.runs:
        # p_{t+1} - 3 = (1 - 2 lr m(t) / size) (p_t - 3): loss after t steps = 9 prod_{s<t} c_s^2;
        # train_loss = mean loss over the last 5% (2) steps, before steps 38 and 39.
        c2 = np.cumprod((1 - 2 * r["lr"] * m / r["size"]) ** 2)
        assert r["schedule"] == "warmup_cosine"
        np.testing.assert_allclose(r["train_loss"], 9 * c2[[37, 38]].mean(), rtol=2e-4, atol=1e-9)
        np.testing.assert_allclose(r["val_loss"], 9 * c2[steps - 1], rtol=2e-4, atol=1e-9)
        assert r["val_curve_steps"] == [10, 20, 30, 40]
        np.testing.assert_allclose(r["val_curve"], 9 * c2[[9, 19, 29, 39]], rtol=2e-4, atol=1e-9)
        assert r["step_seconds"] > 0
    both = res.summaries()
    assert both["train"]["metric"] == "train_loss" and both["val"]["metric"] == "val_loss"
    # The schedule is part of the resume key: a constant-LR sweep reruns, a scheduled one does not.
    again = lab.sweep(quadratic_family, lambda lr: optax.sgd(lr), [1, 2], lrs, data, steps=steps,
                      batch_size=4, results=path, progress=False, name="q", schedule="warmup_cosine")
    assert [r["val_loss"] for r in again.runs] == [r["val_loss"] for r in res.runs]
    const = lab.sweep(quadratic_family, lambda lr: optax.sgd(lr), [1, 2], lrs, data, steps=steps,
                      batch_size=4, results=path, progress=False, name="q")
    assert all(r["schedule"] == "constant" for r in const.runs) and len(path.read_text().splitlines()) == 8
    with pytest.raises(ValueError, match="schedule"):
        lab.sweep(quadratic_family, lambda lr: optax.sgd(lr), [1], lrs, data, steps=steps, batch_size=4,
                  progress=False, schedule="linear")


def test_update_args_need_a_model_that_records():
    data = lab.digits()
    with pytest.raises(ValueError, match="loss_with_aux"):
        lab.sweep(lab.mlp_family(data), lambda lr: optax.sgd(lr), [8], [0.1], data, steps=2, batch_size=4,
                  progress=False, update_args=lambda aux: {})


@pytest.mark.slow
def test_sweep_passes_recorded_logits_to_the_update_and_clips_after_the_schedule():
    """QK-clip through lab.sweep: the max logits of each step's forward pass reach ``update`` (update_args), the
    clip sits after the schedule (after_schedule) and step_metrics records every step. A clip that never acts
    leaves the runs equal to the plain sweep's; one under every logit clips every head of every step."""
    data = lab.load("text", context=16, sequence=True)
    family = lab.gpt_family(data, vary="width", depth=1, init="spectral", record_max_logits=True)
    x0 = data.numpy_batch("train", [0])[0]
    common = dict(sizes=[32], lrs=[0.03, 0.3], data=data, steps=6, batch_size=4, seeds=[0],
                  schedule="warmup_cosine", eval_examples=256, progress=False)

    def clipped(tau):
        return lab.sweep(
            family, lambda lr: so.muon(lr), **common,
            update_args=lambda ml: {"max_logits": ml},
            step_metrics=lambda ml: {"clipped": jnp.sum(ml["blocks/attn"] > tau), "peak": jnp.max(ml["blocks/attn"])},
            after_schedule=lambda w: so.qk_clip(tau, geometry=family(w).geometry(x0)),
        ).runs

    plain = lab.sweep(lab.gpt_family(data, vary="width", depth=1, init="spectral"), lambda lr: so.muon(lr),
                      **common).runs
    never = clipped(1e9)
    for a, b in zip(never, plain):
        assert a["lr"] == pytest.approx(b["lr"])
        assert a["step_metrics"]["clipped"] == [0.0] * 6
        assert len(a["step_metrics"]["peak"]) == 6 and all(np.isfinite(a["step_metrics"]["peak"]))
        np.testing.assert_allclose([a["train_loss"], a["val_loss"]], [b["train_loss"], b["val_loss"]], rtol=1e-4)
    always = clipped(1e-3)
    heads = 32 // 16  # one block, head_dim 16
    for a, b in zip(always, never):
        assert a["step_metrics"]["clipped"] == [float(heads)] * 6
        assert a["val_loss"] != b["val_loss"]


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
        quadratic_family, lambda lr, n: optax.sgd(lr), [2], [0.1], data, schedule="warmup_cosine", devices=1, **kw
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
    again = lab.sweep(quadratic_family, lambda lr, n: optax.sgd(lr), [2], [0.1], data, **kw)
    (rec2,) = again.runs
    assert rec2["schedule"] == "constant"
    np.testing.assert_allclose(rec2["curve"], _closed_form_losses(0.1, [1.0] * 4), rtol=1e-5)
    assert len(lab.load_runs(path)) == 2


def test_sweep_refuses_a_seed_outside_uint32():
    """A seed that does not fit the uint32 PRNG seed is refused instead of silently aliasing another seed."""
    data = lab.digits_binary()
    with pytest.raises(OverflowError):
        lab.sweep(quadratic_family, optax.sgd, [2], [0.1], data, steps=2, batch_size=2, seeds=(2**32,), progress=False)
