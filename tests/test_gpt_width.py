"""benchmarks.gpt_width through its command line (tiny end-to-end runs, slow: schema, the widest verdict and
the tables read against the JSON's own summary, resume, figures, the ablation flags recorded) and the lab
functions it is built from: the drift diagnosis's quadratic steps and route labels (``lab.quadratic_steps``,
``lab.route_labels``) and the registry's Muon / MOGA options its flags pass (``lab.optimizer``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectral_optax import lab


def test_unknown_optimizer_is_refused_by_name():
    from benchmarks import gpt_width

    with pytest.raises(SystemExit, match="lion"):
        gpt_width.main(["--optimizers", "muon,lion"])


def _row(name, s, widths):
    """The table row of ``name`` written from the JSON summary ``s`` (keys are strings there)."""
    cells = [f"{s['best_lr'][str(w)]:.3g}" + ("*" if w in s["at_edge"] else "") for w in widths]
    lo, hi = s["exponent_interval"]
    return (
        f"| {name} | " + " | ".join(cells) + f" | {s['spread_steps']:.2f} | {s['exponent']:+.2f} "
        f"[{lo:+.2f}, {hi:+.2f}] | {s['loss_at_best'][str(widths[-1])]:.3f} |"
    )


@pytest.mark.slow
def test_end_to_end_schema_resume_and_figures(tmp_path, capsys):
    path = tmp_path / "out.json"
    argv = [
        "--quick",
        "--widths",
        "16,32",
        "--steps",
        "2",
        "--num-lrs",
        "2",
        "--seeds",
        "2",
        "--optimizers",
        "mup_adamw,adamw_sp",
        "--batch-size",
        "2",
        "--context",
        "8",
        "--json",
        str(path),
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    from benchmarks import gpt_width

    gpt_width.main(argv)
    assert "--quick is a smoke run" in capsys.readouterr().out  # item 5: it says so and names the preset
    res = json.loads(path.read_text())
    cfg = res["config"]  # the preset's sizes with the flags' overrides
    assert (cfg["widths"], cfg["seeds"], cfg["steps"], cfg["num_lrs"], cfg["context"], cfg["batch_size"]) == (
        [16, 32],
        2,
        2,
        2,
        8,
        2,
    )
    assert cfg["optimizers"] == ["mup_adamw", "adamw_sp"] and cfg["depth"] == 2  # the quick preset's depth
    assert len(res["runs"]) == 2 * 2 * 2 * 2  # optimizers x widths x LRs x seeds
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in res["runs"])
    for key in ("mup_adamw", "mup_adamw/val", "adamw_sp", "adamw_sp/val"):
        s = res["summary"][key]
        assert sorted(int(w) for w in s["best_lr"]) == [16, 32]
        assert set(s["exponent_per_seed"]) == {"0", "1"} and len(s["exponent_interval"]) == 2
    assert res["widest"]["width"] == 32
    for what, suffix in (("train", ""), ("val", "/val")):  # the verdict and the tables from the JSON's summary
        losses = {n: res["summary"][n + suffix]["loss_at_best"]["32"] for n in ("mup_adamw", "adamw_sp")}
        assert res["widest"][what]["loss_at_best"] == losses
        assert res["widest"][what]["mup_family_le_sp"] is (losses["mup_adamw"] <= losses["adamw_sp"])
        for n in ("mup_adamw", "adamw_sp"):
            assert _row(n, res["summary"][n + suffix], [16, 32]) in res["tables"][what].splitlines()
    for fig in res["figures"]:
        with open(fig, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = (tmp_path / "gpt_width_quick.jsonl").read_text().splitlines()
    capsys.readouterr()
    gpt_width.main(argv)  # resumes: nothing retrained, nothing appended
    assert (tmp_path / "gpt_width_quick.jsonl").read_text().splitlines() == lines


def test_quadratic_steps_exact_on_a_quadratic(highest_precision):
    """L(theta) = 0.5 theta^T A theta - b^T theta over two leaves: eta* = -g.u_r / (u_r^T A u_r) per route,
    computed here in float64 NumPy."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    m = rng.normal(size=(7, 7))
    a = m @ m.T + 7 * np.eye(7)
    b = rng.normal(size=7)
    theta = {"h": rng.normal(size=(2, 2)), "v": rng.normal(size=(3,))}  # 4 + 3 = 7 coordinates
    u = {"h": rng.normal(size=(2, 2)), "v": rng.normal(size=(3,))}

    def flat(t):
        return np.concatenate([np.ravel(t["h"]), np.ravel(t["v"])])

    def loss(t):  # float32, well conditioned (A = M M^T + 7 I): relative error ~1e-6
        z = jnp.concatenate([t["h"].ravel(), t["v"].ravel()])
        return 0.5 * z @ jnp.asarray(a, jnp.float32) @ z - jnp.asarray(b, jnp.float32) @ z

    tj = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), theta)
    uj = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), u)
    g = jax.grad(loss)(tj)
    out = lab.quadratic_steps(loss, tj, g, uj, ["hidden", "vector"])
    g64 = a @ flat(theta) - b
    for route, mask in (
        ("all", np.ones(7)),
        ("hidden", np.r_[np.ones(4), np.zeros(3)]),
        ("vector", np.r_[np.zeros(4), np.ones(3)]),
    ):
        ur = flat(u) * mask
        assert float(out[route]["decrease"]) == pytest.approx(-g64 @ ur, rel=1e-4)
        assert float(out[route]["curvature"]) == pytest.approx(ur @ a @ ur, rel=1e-4)
        assert float(out[route]["eta_star"]) == pytest.approx(-(g64 @ ur) / (ur @ a @ ur), rel=1e-4)
    assert float(out["head"]["curvature"]) == 0.0  # no leaf on that route


def test_route_labels_of_the_gpt():
    data = lab.load("text", context=8, sequence=True)
    shapes = lab.gpt_family(data, vary="width", depth=2)(32).shapes()
    import jax

    paths = [
        "/".join(str(getattr(k, "key", k)) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]
    ]
    routes = dict(zip(paths, lab.route_labels(shapes)))
    assert routes["head/kernel"] == "head" and routes["head/bias"] == "vector"
    assert routes["embed/embedding"] == routes["pos_embed/embedding"] == "embedding"
    assert routes["blocks/attn/qkv/kernel"] == routes["blocks/mlp/dense_1/kernel"] == "hidden"
    assert routes["blocks/ln_attn/scale"] == routes["ln_final/bias"] == "vector"


@pytest.mark.slow
def test_diagnose_end_to_end(tmp_path):
    from benchmarks import gpt_width

    path = tmp_path / "drift.json"
    gpt_width.main(
        [
            "--quick",
            "--diagnose",
            "--widths",
            "16,32",
            "--seeds",
            "2",
            "--warm-steps",
            "2",
            "--batch-size",
            "2",
            "--context",
            "8",
            "--optimizers",
            "muon",
            "--json",
            str(path),
            "--out",
            str(tmp_path),
            "--muon-adam-lr",
            "0.01",
            "--muon-head",
            "adamw",
            "--moga-head-base",
            "2",
        ]
    )
    res = json.loads(path.read_text())
    # the ablation flags, as the registry's keyword arguments (their effect: the two tests below)
    assert res["config"]["muon_options"] == {"adam_learning_rate": 0.01, "output": "adamw"}
    assert res["config"]["moga_options"] == {"head_base_width": 2.0}
    muon = res["drift"]["muon"]
    for route in ("all", "hidden", "head", "embedding", "vector"):
        assert set(muon["eta_star"][route]) == {"16", "32"}
        assert all(len(v) == 2 for v in muon["eta_star"][route].values())
        assert set(muon["exponent"][route]) == {"mean", "per_seed", "interval"}
    # a descent direction: positive first-order decrease along the whole update
    assert all(d > 0 for v in muon["decrease"]["all"].values() for d in v)
    with open(res["figure"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_muon_ablation_options_reach_the_routes():
    """``--muon-adam-lr`` / ``--muon-head adamw`` (``lab.optimizer('muon')``'s options): the head and the embeddings take AdamW's first step
    (each entry -lr * sign(g), bias-corrected) at the fixed LR, the hidden matrix Muon's."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    params = {
        "embed": {"embedding": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)},
        "Dense_0": {"kernel": jnp.asarray(rng.standard_normal((8, 8)), jnp.float32)},
        "head": {"kernel": jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)},
    }
    grads = {
        k: {n: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for n, v in d.items()} for k, d in params.items()
    }
    tx = lab.optimizer("muon")(0.5, adam_learning_rate=0.01, output="adamw")
    u, _ = tx.update(grads, tx.init(params), params)
    for path in (("head", "kernel"), ("embed", "embedding")):
        np.testing.assert_allclose(np.asarray(u[path[0]][path[1]]), -0.01 * np.sign(grads[path[0]][path[1]]), rtol=1e-4)
    # The hidden matrix: Muon at lr 0.5 (an orthogonalized step, singular values near 0.5, not AdamW's).
    s = np.linalg.svd(np.asarray(u["Dense_0"]["kernel"], np.float64), compute_uv=False)
    assert 0.5 * 0.6 < s.min() and s.max() < 0.5 * 1.25
    plain = lab.optimizer("muon")(0.5)
    u0, _ = plain.update(grads, plain.init(params), params)
    assert not np.allclose(np.asarray(u0["head"]["kernel"]), np.asarray(u["head"]["kernel"]))


def test_moga_head_base_option_reaches_the_head():
    """``--moga-head-base W`` (``lab.optimizer('moga')``'s ``head_base_width``): MOGA's head fan-in vectors get l2 norm sqrt(W / d_in) (EMA momentum 0.95 of
    one gradient: direction of g, whatever its size), the hidden matrix is unchanged."""
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    params = {
        "Dense_0": {"kernel": jnp.asarray(rng.standard_normal((8, 8)), jnp.float32)},
        "head": {"kernel": jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)},
    }
    grads = {
        k: {n: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for n, v in d.items()} for k, d in params.items()
    }
    outs = {}
    for key, options in (("base", {"head_base_width": 2.0}), ("published", {})):
        tx = lab.optimizer("moga")(1.0, **options)
        outs[key] = tx.update(grads, tx.init(params), params)[0]
    g = np.asarray(grads["head"]["kernel"], np.float64)
    want = -g / np.linalg.norm(g, axis=0) * np.sqrt(2 / 8)
    np.testing.assert_allclose(np.asarray(outs["base"]["head"]["kernel"]), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(outs["published"]["head"]["kernel"]), want * 2, rtol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(outs["base"]["Dense_0"]["kernel"]), np.asarray(outs["published"]["Dense_0"]["kernel"])
    )
