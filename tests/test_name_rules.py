"""The name rules and the resolver: geometries of parameters named as in public model code (GPT-2's Conv1D,
attention out kernels, per-position convolutions, the head), written out by hand from the layouts in docs/guide.md."""

import warnings

from spectral_optax import Geometry, GeometryMap, GeometryWarning


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
