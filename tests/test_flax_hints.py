"""Flax module hints: einsum layouts, the hints of Linen modules with or without a ``params`` prefix, and
``strict`` through ``GeometryMap.from_linen``; geometries written out by hand."""


import flax.linen as nn
import jax.numpy as jnp
import pytest
from test_name_rules import _axes, _resolve

from spectral_optax import GeometryError, GeometryMap, GeometryWarning
from spectral_optax._geometry.flax_hints import _einsum_layout, _Layout, _module_layouts

EINSUM_HINT = {("attn",): {"kernel": _einsum_layout("BTD,NDH->BTNH")}}


def test_gemma_einsum_weights_axes():
    """Gemma's q_einsum (N, D, H) has fan-in D, fan-out N, H; attn_vec_einsum (N, H, D) fan-in N, H."""
    geoms, _ = _resolve({"attn/q_einsum/w": (4, 8, 2), "attn/attn_vec_einsum/w": (4, 2, 8)}, strict=True)
    assert _axes(geoms["attn/q_einsum/w"]) == ("matrix", (), (1,), (0, 2), 1, "hidden")
    assert _axes(geoms["attn/attn_vec_einsum/w"]) == ("matrix", (), (0, 1), (2,), 1, "hidden")


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
