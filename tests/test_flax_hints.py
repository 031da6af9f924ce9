"""Flax module hints, recorded by ``GeometryMap.from_nnx`` (no example inputs: the hints alone) and
``GeometryMap.from_linen`` (a leaf at another shape than the traced one: the hint decides): einsum layouts, the
hints with or without a ``params`` prefix, the leaves each module's hints cover, and ``strict``; geometries
written out by hand."""

import warnings

import flax.linen as nn
import jax.numpy as jnp
import pytest
from flax import nnx
from test_name_rules import _axes, _resolve

from spectral_optax import GeometryError, GeometryMap, GeometryWarning


class _Hinted(nnx.Module):
    """An einsum ``attn`` (Gemma's q projection, weight 'NDH'), a Linear ``blk`` and one of each norm."""

    def __init__(self, rngs):
        self.attn = nnx.Einsum("BTD,NDH->BTNH", (2, 8, 4), rngs=rngs)
        self.blk = nnx.Linear(4, 6, rngs=rngs)
        self.norms = nnx.Dict(
            LayerNorm=nnx.LayerNorm(6, rngs=rngs),
            RMSNorm=nnx.RMSNorm(6, rngs=rngs),
            GroupNorm=nnx.GroupNorm(6, num_groups=2, rngs=rngs),
            BatchNorm=nnx.BatchNorm(6, rngs=rngs),
        )


def _hints_only():
    """``GeometryMap.from_nnx`` without example inputs: the module hints decide (its no-read-out warning muted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeometryWarning)
        return GeometryMap.from_nnx(_Hinted(nnx.Rngs(0)), strict=True)


def test_gemma_einsum_weights_axes():
    """Gemma's q_einsum (N, D, H) has fan-in D, fan-out N, H; attn_vec_einsum (N, H, D) fan-in N, H."""
    geoms, _ = _resolve({"attn/q_einsum/w": (4, 8, 2), "attn/attn_vec_einsum/w": (4, 2, 8)}, strict=True)
    assert _axes(geoms["attn/q_einsum/w"]) == ("matrix", (), (1,), (0, 2), 1, "hidden")
    assert _axes(geoms["attn/attn_vec_einsum/w"]) == ("matrix", (), (0, 1), (2,), 1, "hidden")


def test_einsum_hint_without_trace_is_used_and_warned():
    """A doubtful einsum hint decides alone without a trace, with a warning naming the path, layout and fix."""
    gm = _hints_only()
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
    """A module hint recorded under 'blk' decides 'blk/kernel' and 'params/blk/kernel' alike (stacked: batch 0)."""
    gm = _hints_only()
    for path in ("params/blk/kernel", "blk/kernel"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (g,) = gm.resolve([path], [(3, 4, 6)])
        assert not caught and gm.decided_by(path, (3, 4, 6)) == "module hint"
        assert _axes(g) == ("matrix", (0,), (1,), (2,), 1, "hidden")


class _Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(6, name="Dense")(x)
        return nn.ConvLocal(5, (1,), name="ConvLocal")(x[..., None])


def test_module_hints_name_kernel_bias_and_norm_leaves():
    """Dense / Linear / ConvLocal hints cover 'kernel' and 'bias'; every norm's hints cover 'scale' and 'bias'
    (each leaf resolved at a stacked shape, which only the hint decides)."""
    linen = GeometryMap.from_linen(_Dense(), jnp.ones((2, 4)))
    hinted = _hints_only()
    kernels = {
        "Dense/kernel": (linen, (3, 4, 6)),
        "ConvLocal/kernel": (linen, (3, 6, 1, 5)),
        "blk/kernel": (hinted, (3, 4, 6)),
    }  # blk: an nnx.Linear
    vectors = {"Dense/bias": (linen, (3, 6)), "ConvLocal/bias": (linen, (3, 6, 5)), "blk/bias": (hinted, (3, 6))}
    vectors |= {
        f"norms/{t}/{leaf}": (hinted, (3, 6))
        for t in ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")
        for leaf in ("scale", "bias")
    }
    for path, (gm, shape) in {**kernels, **vectors}.items():
        (g,) = gm.resolve([path], [shape])
        assert gm.decided_by(path, shape) == "module hint", path
        n = len(shape)
        want = (
            ("matrix", tuple(range(n - 2)), (n - 2,), (n - 1,))
            if path in kernels
            else ("vector", tuple(range(n - 1)), (), (n - 1,))
        )
        assert _axes(g)[:4] == want, path


def test_strict_survives_from_linen_and_with_overrides():
    """strict=True given to from_linen, and kept by with_overrides, makes an undecided leaf an error."""
    gm = GeometryMap.from_linen(nn.Dense(4), jnp.ones((2, 3)), strict=True)
    for m in (gm, GeometryMap(strict=True).with_overrides({r"^b$": "vector"})):
        assert m.strict is True
        with pytest.raises(GeometryError, match="cannot infer the geometry of parameter 'w' with shape"):
            m.resolve(["w", "b"], [(2, 3, 4), (4,)])
