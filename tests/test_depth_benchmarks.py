"""End-to-end smoke tests of the depth benchmarks on real architectures (tiny settings).

They check the promised interface, not the science: the JSON summary's schema
(``benchmarks.depth_transfer``'s keys for train and validation loss; the joint
benchmark's per-optimizer keys), that every (variant, depth, LR) run was
trained and recorded with finite losses and a throughput, that a second
invocation resumes from the JSONL instead of retraining, and that the
figures are written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

FIELDS = ("best_lr", "loss_at_best", "spread_steps", "at_edge", "diverged")


def _check_depth_summary(res, optimizers, depths, num_lrs):
    summary = res["summary"]
    for name in optimizers:
        for form in ("scaled", "unscaled"):
            for key in (f"{name}/{form}", f"{name}/{form}/val"):
                assert key in summary, key
                for field in FIELDS:
                    assert field in summary[key], (key, field)
                assert sorted(int(d) for d in summary[key]["best_lr"]) == sorted(depths)
    runs = res["runs"]
    assert len(runs) == len(optimizers) * 2 * len(depths) * num_lrs
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in runs)
    assert {r["name"] for r in runs} == {f"{n}/{f}" for n in optimizers for f in ("scaled", "unscaled")}


@pytest.mark.parametrize("bench", ["gpt_depth", "resnet_depth"])
def test_depth_benchmark_schema_resume_and_figures(bench, tmp_path, capsys):
    import importlib

    mod = importlib.import_module(f"benchmarks.{bench}")
    path = tmp_path / "out.json"
    argv = ["--quick", "--depths", "2,4", "--steps", "4", "--num-lrs", "2", "--optimizers", "muon",
            "--batch-size", "4", "--json", str(path), "--out", str(tmp_path), "--no-progress"]
    if bench == "gpt_depth":
        argv += ["--context", "16"]
    mod.main(argv)
    res = json.loads(path.read_text())
    _check_depth_summary(res, ["muon"], [2, 4], 2)
    tput = res[f"throughput_{'tokens' if bench == 'gpt_depth' else 'images'}_per_s"]
    assert all(v > 0 for per in tput.values() for v in per.values())
    which = res["which_optimizer"]
    assert which["depth"] == 4 and set(which["runs"]) == {"muon"}
    assert all(r["step_seconds"] > 0 for r in which["runs"].values())
    for fig in res["figures"]:
        with open(fig, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = (tmp_path / f"{bench}_quick.jsonl").read_text().splitlines()
    capsys.readouterr()
    mod.main(argv)  # resumes: nothing retrained, nothing appended
    assert (tmp_path / f"{bench}_quick.jsonl").read_text().splitlines() == lines
    assert json.loads(path.read_text())["summary"] == res["summary"]


def test_joint_transfer_schema(tmp_path):
    from benchmarks import joint_transfer

    path = tmp_path / "joint.json"
    joint_transfer.main(["--quick", "--widths", "16,32", "--depths", "2,4", "--steps", "4", "--num-lrs", "2",
                         "--batch-size", "4", "--json", str(path), "--out", str(tmp_path), "--no-progress"])
    res = json.loads(path.read_text())
    configs = {f"w{w}/K{d}" for w in (16, 32) for d in (2, 4)}
    assert set(res["summary"]) == {"muon", "moga", "mup_adamw"}
    for s in res["summary"].values():
        assert set(s["best_lr"]) == configs and set(s["best_lr_val"]) == configs
        assert s["spread_steps"] >= 0 and s["spread_steps_val"] >= 0
    assert len(res["runs"]) == 3 * len(configs) * 2
    with open(res["figure"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_gpt_depth_rules_side_by_side(tmp_path):
    """``--forms scaled,depth_mup``: both rules recorded; at K = K_base = 2 they are the same network and
    the same optimizer (alpha = 1, LR factor 1), so the losses agree; at K = 4 they differ."""
    from benchmarks import gpt_depth

    path = tmp_path / "rules.json"
    gpt_depth.main(["--quick", "--depths", "2,4", "--steps", "4", "--num-lrs", "2", "--optimizers", "adamw",
                    "--forms", "scaled,depth_mup", "--batch-size", "4", "--context", "16", "--json", str(path),
                    "--out", str(tmp_path), "--no-progress"])
    res = json.loads(path.read_text())
    assert {"adamw/scaled", "adamw/depth_mup", "adamw/depth_mup/val"} <= set(res["summary"])
    by = {(r["name"], r["size"], r["lr"]): r["train_loss"] for r in res["runs"]}
    for (name, size, lr), loss in by.items():
        if name == "adamw/depth_mup":
            other = by[("adamw/scaled", size, lr)]
            if size == 2:
                assert loss == pytest.approx(other, rel=1e-5)
            else:
                assert abs(loss - other) > 1e-4


def test_joint_transfer_gpt(tmp_path):
    """``--model gpt``: the GPT family at every width x depth, its own results file and figure."""
    from benchmarks import joint_transfer

    path = tmp_path / "joint_gpt.json"
    joint_transfer.main(["--quick", "--model", "gpt", "--widths", "16,32", "--depths", "2,4", "--steps", "3",
                         "--num-lrs", "2", "--batch-size", "2", "--optimizers", "muon", "--json", str(path),
                         "--out", str(tmp_path), "--no-progress"])
    res = json.loads(path.read_text())
    assert res["model"] == "gpt" and set(res["summary"]) == {"muon"}
    assert set(res["summary"]["muon"]["best_lr"]) == {f"w{w}/K{d}" for w in (16, 32) for d in (2, 4)}
    runs = res["runs"]
    assert len(runs) == 4 * 2 and all(r["name"] == "joint/gpt/muon" for r in runs)
    assert all(np.isfinite(r["train_loss"]) for r in runs)
    assert (tmp_path / "joint_transfer_gpt_quick.png").exists()
