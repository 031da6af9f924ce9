"""A depth sweep widens itself where it is thin: extra seeds at chosen depths, and an LR beyond the grid's edge
wherever a depth's best sits on it (``--seed-depths``, ``--extend-edges``; the ``cpu64`` preset uses both).

The reference is the run records themselves: which grid LR had the lower seed-averaged loss decides on which
side the extension must lie, recomputed here from the JSON's runs with plain numpy.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _mean_loss(runs, metric):
    by = defaultdict(list)
    for r in runs:
        by[float(r["lr"])].append(r[metric] if np.isfinite(r[metric]) else np.inf)
    return {lr: float(np.mean(v)) for lr, v in by.items()}


def test_extra_seeds_and_an_lr_beyond_the_edge_then_resume(tmp_path, capsys):
    from benchmarks import gpt_depth

    argv = ["--quick", "--depths", "2,4", "--steps", "6", "--num-lrs", "2", "--optimizers", "adamw", "--forms",
            "scaled", "--seed-depths", "4:2", "--extend-edges", "1", "--no-progress", "--out", str(tmp_path),
            "--json", str(tmp_path / "r.json")]  # fmt: skip
    gpt_depth.main(argv)
    res = json.loads((tmp_path / "r.json").read_text())
    runs = res["runs"]
    grid = sorted({float(r["lr"]) for r in runs if r["size"] == 2})[:2]
    for depth, seeds in ((2, {0}), (4, {0, 1})):
        mine = [r for r in runs if r["size"] == depth]
        lrs = sorted({float(r["lr"]) for r in mine})
        # Every LR of the depth has every seed of the depth: the averages compare like with like.
        assert {(float(r["lr"]), r["seed"]) for r in mine} == {(lr, s) for lr in lrs for s in seeds}
        # With two grid LRs the best is always at an edge: one more LR, a grid step beyond the best side
        # for the train or the validation loss (both when they disagree).
        base = [r for r in mine if float(r["lr"]) in grid] if len(lrs) > 2 else mine
        want = set()
        for metric in ("train_loss", "val_loss"):
            m = _mean_loss(base, metric)
            lo, hi = sorted(m)
            want.add(lo / 2 if m[lo] <= m[hi] else hi * 2)
        assert sorted(set(lrs) - set(grid)) == pytest.approx(sorted(want), rel=1e-9), (depth, lrs, grid)
        assert len(lrs) == 2 + len(want)
    lines = (tmp_path / "gpt_depth_quick.jsonl").read_text().splitlines()
    assert len(lines) == len(runs)
    # A rerun resumes: nothing trained again, nothing appended.
    gpt_depth.main(argv)
    assert (tmp_path / "gpt_depth_quick.jsonl").read_text().splitlines() == lines


def test_seed_depths_needs_a_count(tmp_path):
    from benchmarks import gpt_depth

    with pytest.raises(SystemExit, match="DEPTHS:K"):
        gpt_depth.main(["--quick", "--seed-depths", "2,16", "--out", str(tmp_path)])
