"""Golden updates: every named optimizer's third update on fixed trees equals what main recorded.

``tools/golden_updates.py`` defines the cases (nine named optimizers x a traced scanned Transformer
with a fused QKV, the same model unrolled with split q/k/v, a name-rules tree in float32 and in
bfloat16; three of them on a 2 x 2 Explicit mesh) and records them in ``tests/golden/``. These tests
recompute each case. On the machine and flags the record was made with (same fingerprint: jax
version, CPU instruction-set flags, ``XLA_FLAGS``) the updates must agree bit for bit, so a module
move or a refactor that changes any arithmetic fails here. Elsewhere they must agree to
``REL_TOL`` of each leaf's largest entry: a band measured across instruction sets (the command is
beside ``REL_TOL``), far below any change of wiring (a wrong multiplier, a lost momentum
term, a transposed fan-in moves an update by O(1) of its size).

Re-record only when a behaviour change is intended, and say so in the commit:
``XLA_FLAGS=--xla_backend_optimization_level=0 python tools/golden_updates.py --record``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("golden_updates", os.path.join(ROOT, "tools", "golden_updates.py"))
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

# Largest relative difference (max |new - recorded| / max |recorded|, per leaf) allowed when the
# fingerprint differs, about 50x (float32) and 4x (bfloat16) the worst leaf of
# ``XLA_FLAGS=--xla_cpu_max_isa=AVX python tools/golden_updates.py`` against an AVX-512 record.
REL_TOL = {"float32": 2e-4, "bfloat16": 3e-2}
# Updates that are a selection, not a smooth function of the gradient: MOGA's p = 1 column dual in
# bfloat16 puts each column's step on its largest entry, and a rounding difference can change which
# (measured 0.99 relative on AVX against AVX-512). Off the recording machine they are compared by
# their largest magnitude only.
SELECTIONS = {"moga_p1_col|names_bf16"}

OPTIMIZERS = sorted(golden.optimizers())


def _compare(new: dict, path: str, tol_for, fingerprint: str | None = None) -> None:
    """``new`` against the record at ``path``: bit for bit when ``fingerprint`` (default: this process's)
    is the record's, else within ``tol_for(key)``."""
    ref = np.load(path)
    exact = str(ref["__fingerprint__"]) == (fingerprint or golden.fingerprint())
    recorded = {k for k in ref.files if k != "__fingerprint__"}
    prefix = {k.split("|")[0] + "|" + k.split("|")[1] for k in new}
    expected = {k for k in recorded if k.split("|")[0] + "|" + k.split("|")[1] in prefix}
    assert set(new) == expected, f"leaves differ: new-only {sorted(set(new) - expected)[:5]}, missing {sorted(expected - set(new))[:5]}"
    bad = []
    for key in sorted(new):
        got, want = new[key], ref[key]
        assert got.shape == want.shape, key
        assert np.all(np.isfinite(got)), key
        if exact:
            if not np.array_equal(got, want):
                bad.append((key, float(np.max(np.abs(got - want)))))
        elif "|".join(key.split("|")[:2]) in SELECTIONS:
            rel = abs(float(np.max(np.abs(got)) - np.max(np.abs(want)))) / (float(np.max(np.abs(want))) + 1e-30)
            if rel > tol_for(key):
                bad.append((key, rel))
        else:
            rel = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
            if rel > tol_for(key):
                bad.append((key, rel))
    mode = "bit for bit (same fingerprint)" if exact else "within REL_TOL (other machine or flags)"
    assert not bad, f"{len(bad)} leaves differ from the golden record, compared {mode}: {bad[:6]}"


def _tol(key: str) -> float:
    return REL_TOL["bfloat16" if "|names_bf16|" in key else "float32"]


@pytest.mark.parametrize("tree", ["names", "names_bf16"])
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_name_rule_trees_match_the_record(opt, tree):
    _compare(golden.compute(names={f"{opt}|{tree}"}, tree_names={tree}), golden.GOLDEN, _tol)


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["scan_fused", "split_unrolled"])
def test_traced_transformers_match_the_record(tree):
    _compare(golden.compute(tree_names={tree}), golden.GOLDEN, _tol)


@pytest.mark.slow
def test_sharded_explicit_mesh_matches_the_record(tmp_path):
    out = tmp_path / "sharded.npz"
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import tools.golden_updates as g;"
        "np.savez(sys.argv[2], **g.compute_sharded()); print(g.fingerprint())"
    )
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4"))
    proc = subprocess.run(
        [sys.executable, "-c", code, ROOT, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fp = proc.stdout.strip().splitlines()[-1]
    _compare(dict(np.load(out)), golden.GOLDEN_SHARDED, lambda key: REL_TOL["float32"], fingerprint=fp)
