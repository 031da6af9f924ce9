"""The pod-scale trees (``spectral_optax.lab.pod``, ``benchmarks.pod_scale --tree``): the geometry their overrides give
(no compile)."""

import jax
import jax.numpy as jnp
import pytest

import spectral_optax as so
from spectral_optax.lab.pod import tree_shapes


@pytest.mark.parametrize("scan", [False, True])
def test_gpt2_trees_cut_the_fused_qkv_in_three(scan):
    # Overrides are tried in order and the first match decides: the stacked c_attn rule must come before
    # the generic stacked-kernel rule, or the fused QKV is taken as one 1600 x 4800 matrix (measured
    # 2026-12-01: GPT-2 XL --scan on 256 devices then ran 3.86x its flop share instead of 1.97x).
    shapes, geometry = tree_shapes("gpt2xl", scan)
    plain = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes, is_leaf=lambda s: isinstance(s, tuple))
    by = dict(so.as_geometry_map(geometry).leaves(plain))  # path strings -> geometry
    qkv = [g for p, g in by.items() if p.endswith("c_attn/kernel")]
    proj = [g for p, g in by.items() if p.endswith("attn/c_proj/kernel")]
    assert qkv and all(g.kind == "matrix" and g.fan_out_splits == 3 for g in qkv)
    assert proj and all(g.kind == "matrix" and g.fan_out_splits == 1 for g in proj)
    assert all(g.num_slices == (48 * 3 if scan else 3) for g in qkv)
