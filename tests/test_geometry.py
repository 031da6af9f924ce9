"""Geometry inference on real Flax models, overrides, errors, the matrix view."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import spectral_optax as so
from spectral_optax import Geometry, GeometryError, GeometryMap


def geoms(params, geometry=None):
    return dict(so.as_geometry_map(geometry).leaves(params))


def axes(g):
    return (g.kind, g.fan_in_axes, g.fan_out_axes, g.batch_axes)


# ---------------------------------------------------------------- Linen models
class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32)(x))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10, name="head")(x)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(16, (5, 5))(x))
        x = x.mean(axis=(1, 2))
        return nn.Dense(10)(x)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
        h = nn.gelu(nn.Dense(128)(nn.LayerNorm()(x)))
        return x + nn.Dense(32)(h)


class Transformer(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(100, 32)(tokens)
        for _ in range(2):
            x = Block()(x)
        return nn.Dense(100, name="head")(nn.LayerNorm()(x))


class ScanBody(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return x + nn.Dense(16, name="fc2")(nn.relu(nn.Dense(16, name="fc1")(x))), None


class ScanStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16)(x)
        stack = nn.scan(ScanBody, variable_axes={"params": 0}, split_rngs={"params": True}, length=5)
        x, _ = stack(name="blocks")(x, None)
        return nn.Dense(1)(x)


def test_linen_mlp():
    p = MLP().init(jax.random.key(0), jnp.ones((1, 7)))["params"]
    g = geoms(p)
    assert axes(g["Dense_0/kernel"]) == ("matrix", (0,), (1,), ())
    assert (g["Dense_0/kernel"].d_in, g["Dense_0/kernel"].d_out) == (7, 32)
    assert g["head/kernel"].role == "output" and g["Dense_1/kernel"].role == "hidden"
    assert axes(g["Dense_0/bias"]) == ("vector", (), (0,), ())
    assert g["Dense_0/bias"].d_in == 1 and g["Dense_0/bias"].target_spectral_norm == pytest.approx(np.sqrt(32))


def test_linen_cnn_fan_in_includes_window():
    p = CNN().init(jax.random.key(0), jnp.ones((1, 12, 12, 3)))["params"]
    # The head is flax's default-named Dense_0 (the only top-level Dense, after the convs): guessed, warned.
    with pytest.warns(so.GeometryWarning, match=r"'Dense_0/kernel'.*taken as the read-out"):
        g = geoms(p)
    assert g["Dense_0/kernel"].role == "output" and g["Conv_1/kernel"].role == "hidden"
    k = g["Conv_1/kernel"]
    assert axes(k) == ("matrix", (0, 1, 2), (3,), ())
    assert (k.d_in, k.d_out) == (5 * 5 * 8, 16)
    assert k.target_spectral_norm == pytest.approx(np.sqrt(16 / 200))


def _gw(tree, geometry=None):
    """Geometries and the paths named by GeometryWarnings."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        g = geoms(tree, geometry)
    msgs = [str(w.message) for w in rec if issubclass(w.category, so.GeometryWarning)]
    return g, {p for p in g if any(f"'{p}'" in m for m in msgs)}, msgs


def test_plain_params_default_named_dense_head_is_guessed_and_warned():
    # A flax-example classifier that names no head: Conv_0, Dense_0, Dense_1, Dense_2 (the read-out).
    o = jnp.ones
    tree = {"Conv_0": {"kernel": o((3, 3, 3, 8)), "bias": o((8,))}, "Dense_0": {"kernel": o((8, 16)), "bias": o((16,))},
            "Dense_1": {"kernel": o((16, 16)), "bias": o((16,))}, "Dense_2": {"kernel": o((16, 10)), "bias": o((10,))}}  # fmt: skip
    for t in (tree, {"params": tree}):
        g, warned, msgs = _gw(t)
        pre = "params/" if "params" in t else ""
        roles = {p: x.role for p, x in g.items()}
        assert roles == {p: "output" if p.startswith(f"{pre}Dense_2/") else "hidden" for p in g}, roles
        assert warned == {f"{pre}Dense_2/kernel", f"{pre}Dense_2/bias"}
        assert all("from_linen" in m and "role='hidden'" in m for m in msgs)
        gm = GeometryMap()
        gm.leaves(t)
        assert gm.decided_by(f"{pre}Dense_2/kernel", (16, 10)) == "name rule, guessed read-out (Dense_2)"
    # The override the warning shows silences it.
    g, warned, _ = _gw(tree, {r"Dense_2/kernel$": dict(kind="matrix", role="hidden"),
                              r"Dense_2/bias$": dict(kind="vector", role="hidden")})  # fmt: skip
    assert not warned and g["Dense_2/kernel"].role == "hidden"
    # A named head: nothing guessed, nothing warned. A lone Dense_0 (no other layer): not guessed.
    g, warned, _ = _gw({**tree, "head": {"kernel": o((10, 3))}})
    assert not warned and g["Dense_2/kernel"].role == "hidden" and g["head/kernel"].role == "output"
    g, warned, _ = _gw({"Dense_0": {"kernel": o((4, 5))}, "LayerNorm_0": {"scale": o((5,))}})
    assert not warned and g["Dense_0/kernel"].role == "hidden"


def test_plain_params_conv_local_and_fused_wqkv():
    # nn.ConvLocal: kernel (out_h, out_w, window x in, out): one matrix per output position.
    o = jnp.ones
    g, warned, _ = _gw({"ConvLocal_0": {"kernel": o((8, 8, 27, 4)), "bias": o((8, 8, 4))}})
    assert not warned
    assert axes(g["ConvLocal_0/kernel"]) == ("matrix", (2,), (3,), (0, 1))
    assert axes(g["ConvLocal_0/bias"]) == ("vector", (), (2,), (0, 1))
    # A Llama-style fused 'wqkv' may be grouped-query (unequal blocks): from plain params it is warned.
    g, warned, msgs = _gw({"attn": {"wqkv": {"kernel": o((8, 24))}, "wo": {"kernel": o((8, 8))}}})
    assert warned == {"attn/wqkv/kernel"} and "fan_out_splits=1" in msgs[0]
    assert g["attn/wqkv/kernel"].fan_out_splits == 3


def test_linen_transformer_dense_general_attention_and_embed():
    p = Transformer().init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))["params"]
    g = geoms(p)
    att = "Block_0/MultiHeadDotProductAttention_0"
    q = g[f"{att}/query/kernel"]
    assert axes(q) == ("matrix", (0,), (1, 2), ()) and (q.d_in, q.d_out) == (32, 32)
    o = g[f"{att}/out/kernel"]
    assert axes(o) == ("matrix", (0, 1), (2,), ()) and (o.d_in, o.d_out) == (32, 32)
    assert axes(g[f"{att}/query/bias"]) == ("vector", (), (0, 1), ())
    e = g["Embed_0/embedding"]
    assert e.kind == "embedding" and (e.d_in, e.d_out, e.input_width) == (100, 32, 1)
    assert g["head/kernel"].role == "output"
    assert g["Block_1/LayerNorm_0/scale"].kind == "vector"
    # Same answer from the model-derived map.
    gm = GeometryMap.from_linen(Transformer(), jnp.zeros((1, 6), jnp.int32))
    assert {k: axes(v) for k, v in geoms(p, gm).items()} == {k: axes(v) for k, v in g.items()}


def test_linen_scan_stack_batch_axis():
    model = ScanStack()
    x = jnp.ones((2, 4))
    p = model.init(jax.random.key(0), x)["params"]
    # Custom names (fc1/fc2) in a scanned body are ambiguous from names alone:
    # an error with strict=True, else the element-wise fallback with a warning ...
    with pytest.raises(GeometryError, match="blocks/fc1/kernel"):
        geoms(p, GeometryMap(strict=True))
    with pytest.warns(so.GeometryWarning, match="blocks/fc1/kernel"):
        g = geoms(p)
    assert axes(g["blocks/fc1/kernel"]) == ("elementwise", (), (), (0, 1, 2))
    # ... and exact once the model is traced.
    g = geoms(p, GeometryMap.from_linen(model, x))
    k = g["blocks/fc1/kernel"]
    assert k.shape == (5, 16, 16)
    assert axes(k) == ("matrix", (1,), (2,), (0,)) and k.num_slices == 5
    assert axes(g["blocks/fc1/bias"]) == ("vector", (), (1,), (0,))
    # A scanned default-named Dense is recognised from its name.
    g2 = geoms({"blocks": {"Dense_0": {"kernel": jnp.ones((5, 16, 8)), "bias": jnp.ones((5, 8))}}})
    assert axes(g2["blocks/Dense_0/kernel"]) == ("matrix", (1,), (2,), (0,))
    assert axes(g2["blocks/Dense_0/bias"]) == ("vector", (), (1,), (0,))
    # Stacked norm scales without a kernel beside them: one vector per layer.
    g3 = geoms({"blocks": {"LayerNorm_0": {"scale": jnp.ones((5, 16))}}})
    assert axes(g3["blocks/LayerNorm_0/scale"]) == ("vector", (), (1,), (0,))


# ---------------------------------------------------------------- NNX models
class NNXNet(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(50, 16, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=16, qkv_features=16, decode=False, rngs=rngs)
        self.conv = nnx.Conv(16, 8, (3,), rngs=rngs)
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.lin = nnx.Linear(8, 4, rngs=rngs)


def test_nnx_state_and_module():
    model = NNXNet(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    # A live module is accepted as geometry. Without example inputs no read-out is seen ('lin' is one
    # by position only): warned, not silently 'hidden'.
    with pytest.warns(so.GeometryWarning, match="without example inputs: no module is named as a read-out"):
        g = geoms(state, model)
    assert axes(g["conv/kernel"]) == ("matrix", (0, 1), (2,), ())
    assert g["conv/kernel"].d_in == 48
    assert axes(g["attn/query/kernel"]) == ("matrix", (0,), (1, 2), ())
    assert axes(g["attn/out/kernel"]) == ("matrix", (0, 1), (2,), ())
    assert g["embed/embedding"].kind == "embedding"
    assert axes(g["lin/kernel"]) == ("matrix", (0,), (1,), ())
    assert g["norm/scale"].kind == "vector"
    # The geometry tree has the State's structure.
    tree = so.expert.infer_geometry(state, model)
    assert jax.tree.structure(tree, is_leaf=lambda x: isinstance(x, Geometry)) == jax.tree.structure(state)
    flat = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Geometry))
    assert all(isinstance(x, Geometry) for x in flat)
    assert [x.shape for x in flat] == [tuple(x.shape) for x in jax.tree_util.tree_leaves(state)]


def test_nnx_vmap_stack():
    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return nnx.Linear(6, 5, rngs=nnx.Rngs(key))

    stack = make(jax.random.split(jax.random.key(0), 3))
    state = nnx.state(stack, nnx.Param)
    g = geoms(state, stack)
    assert axes(g["kernel"]) == ("matrix", (1,), (2,), (0,))
    assert axes(g["bias"]) == ("vector", (), (1,), (0,))


# ---------------------------------------------------------------- overrides and errors
def test_unknown_leaf_error_names_path_and_fix():
    with pytest.raises(GeometryError) as e:
        geoms({"block": {"w": jnp.ones((3, 4, 5))}}, GeometryMap(strict=True))
    msg = str(e.value)
    assert "'block/w'" in msg and "(3, 4, 5)" in msg and "fan_in_axes" in msg


def test_unknown_leaf_falls_back_to_elementwise_once_with_a_warning():
    gmap = GeometryMap()
    tree = {"block": {"w": jnp.ones((3, 4, 5))}, "Dense_0": {"kernel": jnp.ones((4, 5))}}
    with pytest.warns(so.GeometryWarning) as record:
        g = dict(gmap.leaves(tree))
    assert len(record) == 1 and "'block/w'" in str(record[0].message) and "strict=True" in str(record[0].message)
    w = g["block/w"]
    assert (w.kind, w.num_slices, w.d_in, w.d_out) == ("elementwise", 60, 1, 1)
    assert g["Dense_0/kernel"].kind == "matrix"
    x = jnp.arange(60.0).reshape(3, 4, 5)
    assert so.expert.to_matrix(x, w).shape == (60, 1, 1)
    np.testing.assert_array_equal(so.expert.from_matrix(so.expert.to_matrix(x, w), w), x)
    with warnings.catch_warnings():  # decided once per map: no second warning
        warnings.simplefilter("error")
        assert dict(gmap.leaves(tree))["block/w"] == w
    # The kind is also available as an override; a bad override still raises (never a fallback).
    assert geoms(tree, {r"block/w$": "elementwise"})["block/w"] == w
    with pytest.raises(GeometryError, match="block/w"):
        geoms(tree, {r"block/w$": {"kind": "elementwise", "fan_in_axes": (0,)}})
    with pytest.raises(GeometryError, match="no fan axes"):
        Geometry((3, 4), "elementwise", (0,), ())


def test_overrides_regex_dict_and_explicit_tree():
    params = {"block": {"w": jnp.ones((3, 4, 5))}, "gain": jnp.ones((5,))}
    g = geoms(params, {r"block/w$": dict(kind="matrix", fan_in_axes=(1,), fan_out_axes=(2,))})
    assert axes(g["block/w"]) == ("matrix", (1,), (2,), (0,))
    tree = {"block": {"w": Geometry.matrix((3, 4, 5), fan_in_axes=(0, 1))}, "gain": Geometry.vector((5,))}
    g = geoms(params, tree)
    assert (g["block/w"].d_in, g["block/w"].d_out) == (12, 5)
    with pytest.raises(GeometryError, match="block/w"):
        geoms(params, {r"block/w$": Geometry.matrix((4, 5))})
    with pytest.raises(GeometryError, match="block/w"):
        geoms(params, {r"block/w$": dict(kind="matrix", fan_in_axes=(0,), fan_out_axes=(0,))})


def test_invalid_geometry_rejected():
    with pytest.raises(GeometryError):
        Geometry((4, 6), "matrix", (0,), (1,), fan_out_splits=4)
    with pytest.raises(GeometryError):
        Geometry((4, 6), "tensor", (0,), (1,))


# ---------------------------------------------------------------- the canonical view
@pytest.mark.parametrize(
    "geometry",
    [
        Geometry.matrix((6, 10)),
        Geometry((3, 3, 4, 5), "matrix", (0, 1, 2), (3,)),  # conv
        Geometry((7, 6, 10), "matrix", (1,), (2,)),  # stacked
        Geometry((6, 2, 5), "matrix", (0,), (1, 2)),  # DenseGeneral out
        Geometry((2, 5, 6), "matrix", (0, 1), (2,)),  # attention out
        Geometry((4, 6, 9), "matrix", (1,), (2,), fan_out_splits=3),  # stacked fused QKV
        Geometry((5, 8), "matrix", (1,), (0,)),  # transposed layout
        Geometry.vector((7,)),
        Geometry.embedding((11, 6)),
    ],
)
def test_to_matrix_matches_numpy_and_roundtrips(geometry):
    x = np.arange(np.prod(geometry.shape), dtype=np.float64).reshape(geometry.shape)
    m = np.asarray(so.expert.to_matrix(jnp.asarray(x, jnp.float32), geometry))
    assert m.shape == (geometry.num_slices, geometry.d_in, geometry.d_out)
    # Independent reference: move axes with NumPy, flatten, split blocks.
    g = geometry
    ref = np.moveaxis(x, g.batch_axes + g.fan_in_axes + g.fan_out_axes, range(x.ndim))
    nb = int(np.prod([g.shape[a] for a in g.batch_axes]))
    ref = ref.reshape(nb, g.d_in, g.fan_out_splits * g.d_out)
    ref = np.concatenate(
        [ref[:, None, :, k * g.d_out:(k + 1) * g.d_out] for k in range(g.fan_out_splits)], axis=1
    ).reshape(-1, g.d_in, g.d_out)
    np.testing.assert_array_equal(m, ref)
    np.testing.assert_array_equal(np.asarray(so.expert.from_matrix(jnp.asarray(m), geometry)), x)


def test_map_with_geometry_keeps_nnx_structure_and_none():
    model = NNXNet(nnx.Rngs(1))
    state = nnx.state(model, nnx.Param)
    out = so.expert.map_with_geometry(lambda g, x: jnp.full(x.shape, g.d_in, x.dtype), model, state)
    assert jax.tree.structure(out) == jax.tree.structure(state)
    assert float(out["conv"]["kernel"][...].max()) == 48.0
    tree = {"a": jnp.ones((2, 3)), "b": None}
    out = so.expert.map_with_geometry(lambda g, x: x * 2, None, tree)
    assert out["b"] is None and float(out["a"][0, 0]) == 2.0
