"""Tests written for the mutants that survived mutation testing of spectral_optax/_geometry/{names,resolve,flax_hints}.py
(name rules, the resolver, Flax hints); see docs/reliability.md, "Mutation testing".

Expected geometries are written out by hand from the layouts documented in docs/guide.md.
"""

import warnings

import flax.linen as nn
import jax.numpy as jnp
import pytest

from spectral_optax import Geometry, GeometryError, GeometryMap, GeometryWarning
from spectral_optax._geometry.flax_hints import _einsum_layout, _Layout, _module_layouts


def _resolve(tree: dict, **kw) -> tuple[dict, list]:
    """``{path: Geometry}`` of a ``{path: shape}`` tree by a fresh map, and the warnings it raised."""
    gm = GeometryMap(**kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        geoms = gm.resolve(list(tree), list(tree.values()))
    return dict(zip(tree, geoms)), caught


def _axes(g: Geometry) -> tuple:
    return g.kind, g.batch_axes, g.fan_in_axes, g.fan_out_axes, g.fan_out_splits, g.role


def test_gpt2_conv1d_kernels_read_transposed_from_c_attn_shape():
    """GPT-2's (features, in) c_attn / c_fc / c_proj kernels: fan-in axis 1, c_attn split in 3, at any depth."""
    geoms, caught = _resolve(
        {"c_attn/kernel": (24, 8), "c_proj/kernel": (8, 8), "h/0/attn/c_attn/kernel": (24, 8)}
        | {"h/0/mlp/c_fc/kernel": (32, 8), "h/0/mlp/c_proj/kernel": (8, 32)},
        strict=True,
    )
    assert not caught
    assert _axes(geoms["c_attn/kernel"]) == ("matrix", (), (1,), (0,), 3, "hidden")
    assert _axes(geoms["c_proj/kernel"]) == ("matrix", (), (1,), (0,), 1, "hidden")
    assert _axes(geoms["h/0/attn/c_attn/kernel"]) == ("matrix", (), (1,), (0,), 3, "hidden")
    # The MLP's kernels find the attention block's c_attn one level up (h/0/attn/c_attn).
    assert _axes(geoms["h/0/mlp/c_fc/kernel"]) == ("matrix", (), (1,), (0,), 1, "hidden")
    assert _axes(geoms["h/0/mlp/c_proj/kernel"]) == ("matrix", (), (1,), (0,), 1, "hidden")


def test_gemma_einsum_weights_axes():
    """Gemma's q_einsum (N, D, H) has fan-in D, fan-out N, H; attn_vec_einsum (N, H, D) fan-in N, H."""
    geoms, _ = _resolve({"attn/q_einsum/w": (4, 8, 2), "attn/attn_vec_einsum/w": (4, 2, 8)}, strict=True)
    assert _axes(geoms["attn/q_einsum/w"]) == ("matrix", (), (1,), (0, 2), 1, "hidden")
    assert _axes(geoms["attn/attn_vec_einsum/w"]) == ("matrix", (), (0, 1), (2,), 1, "hidden")


def test_attention_out_kernel_heads_are_fan_in():
    """An attention's out kernel (*stack, heads, head_dim, out): heads and head_dim fan-in, the role kept."""
    geoms, _ = _resolve({"head/attention/out/kernel": (3, 2, 4, 8), "attention/out/kernel": (2, 4, 8)}, strict=True)
    # A read-out name above the kernel: role 'output'; a stacked layer axis first is a batch axis.
    assert _axes(geoms["head/attention/out/kernel"]) == ("matrix", (0,), (1, 2), (3,), 1, "output")
    assert _axes(geoms["attention/out/kernel"]) == ("matrix", (), (0, 1), (2,), 1, "hidden")


def test_out_kernel_is_attention_by_fused_qkv_sibling():
    """A module 'out' whose sibling is a fused 'qkv' (no 'attention' in the path) is an attention output."""
    geoms, caught = _resolve({"blk/qkv/kernel": (8, 24), "blk/out/kernel": (2, 4, 8)}, strict=True)
    assert not caught
    assert _axes(geoms["blk/out/kernel"]) == ("matrix", (), (0, 1), (2,), 1, "hidden")
    assert _axes(geoms["blk/qkv/kernel"]) == ("matrix", (), (0,), (1,), 3, "hidden")


def test_conv_local_kernel_by_name_is_one_matrix_per_position():
    """A ConvLocal kernel (*out_positions, window x in, out): the positions are batch axes."""
    geoms, _ = _resolve({"ConvLocal_0/kernel": (3, 12, 8)}, strict=True)
    assert _axes(geoms["ConvLocal_0/kernel"]) == ("matrix", (0,), (1,), (2,), 1, "hidden")


def test_conv_kernel_with_per_position_bias_is_conv_local_without_warning():
    """A conv-named kernel whose bias is (*out_positions, out) is read as a ConvLocal kernel, with no warning."""
    geoms, caught = _resolve({"Conv_0/kernel": (2, 2, 12, 8), "Conv_0/bias": (2, 2, 8)}, strict=True)
    assert not [w for w in caught if issubclass(w.category, GeometryWarning)]
    assert _axes(geoms["Conv_0/kernel"]) == ("matrix", (0, 1), (2,), (3,), 1, "hidden")
    assert _axes(geoms["Conv_0/bias"]) == ("vector", (0, 1), (), (2,), 1, "hidden")


def test_default_head_is_highest_numbered_dense_in_any_order():
    """The guessed read-out is the highest-numbered top-level Dense_N even when it is not the last in the tree,
    and its warning points at the same frame as the resolver's other name-rule warnings."""
    tree = {"Dense_0/kernel": (4, 6), "Dense_2/kernel": (6, 3), "Dense_1/kernel": (6, 6), "wqkv/kernel": (6, 24)}
    geoms, caught = _resolve(tree, strict=True)
    assert geoms["Dense_2/kernel"].role == "output"
    assert geoms["Dense_1/kernel"].role == "hidden" and geoms["Dense_0/kernel"].role == "hidden"
    head = [w for w in caught if "highest-numbered top-level Dense_N" in str(w.message)]
    gqa = [w for w in caught if "grouped-query attention" in str(w.message)]
    assert len(head) == 1 and len(gqa) == 1
    assert "'Dense_2'" in str(head[0].message) and "Dense_2/kernel$" in str(head[0].message)
    # Both are warned from the resolver at the same depth: attributed to the same file (the resolver's).
    assert head[0].filename == gqa[0].filename != __file__


EINSUM_HINT = {("attn",): {"kernel": _einsum_layout("BTD,NDH->BTNH")}}


def test_einsum_hint_without_trace_is_used_and_warned():
    """A doubtful einsum hint decides alone without a trace, with a warning naming the path, layout and fix."""
    gm = GeometryMap(hints=EINSUM_HINT, strict=True)
    with pytest.warns(GeometryWarning) as rec:
        (g,) = gm.resolve(["params/attn/kernel"], [(5, 2, 8, 4)])
    # A stacked axis first (batch), then the weight 'NDH': fan-in D, fan-out N and H.
    assert _axes(g) == ("matrix", (0,), (2,), (1, 3), 1, "hidden")
    assert gm.decided_by("params/attn/kernel", (5, 2, 8, 4)) == "module hint (warned: unchecked without a trace)"
    msg = " ".join(str(w.message) for w in rec)
    assert (
        "parameter 'params/attn/kernel' with shape (5, 2, 8, 4): taken as matrix in(2,) out(1, 3) from its module"
        in msg
    )
    assert "the einsum 'BTD,NDH->BTNH' gives the weight 2 output axes (N, H)" in msg
    assert "Pass example inputs so that the trace decides" in msg


def test_module_hints_found_with_or_without_params_prefix():
    """A module hint recorded under 'Dense_0' decides 'Dense_0/kernel' and 'params/Dense_0/kernel' alike."""
    hints = {("blk",): {"w": _Layout("matrix", 1, 1)}}
    tree = {"params/blk/w": (3, 4, 6), "blk/w": (2, 4, 6)}
    geoms, caught = _resolve(tree, hints=hints, strict=True)
    assert not caught
    assert _axes(geoms["params/blk/w"]) == ("matrix", (0,), (1,), (2,), 1, "hidden")
    assert _axes(geoms["blk/w"]) == ("matrix", (0,), (1,), (2,), 1, "hidden")


def test_module_layouts_name_bias_and_norm_leaves():
    """Dense / Linear / ConvLocal hints cover 'kernel' and 'bias'; every norm's hints cover 'scale' and 'bias'."""
    for t in ("Dense", "Linear", "ConvLocal"):
        assert _module_layouts(t, {}) == {"kernel": _Layout("matrix", 1, 1), "bias": _Layout("vector", 0, 1)}
    for t in ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm"):
        assert _module_layouts(t, {}) == {"scale": _Layout("vector", 0, 1), "bias": _Layout("vector", 0, 1)}


def test_strict_survives_from_linen_and_with_overrides():
    """strict=True given to from_linen, and kept by with_overrides, makes an undecided leaf an error."""
    gm = GeometryMap.from_linen(nn.Dense(4), jnp.ones((2, 3)), strict=True)
    for m in (gm, GeometryMap(strict=True).with_overrides({r"^b$": "vector"})):
        assert m.strict is True
        with pytest.raises(GeometryError, match="cannot infer the geometry of parameter 'w' with shape"):
            m.resolve(["w", "b"], [(2, 3, 4), (4,)])
