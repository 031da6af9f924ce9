"""The jaxpr walk that reads each parameter's geometry off a traced forward pass.

Each test traces a tiny function written here (4 x 6 matrices) through the public entry points
(``so.GeometryMap.from_apply``, ``so.init_with_geometry``) and checks the decision, and how it was made
(``GeometryMap.decided_by``), against the geometry read by hand from the function's code.
"""

import re
import warnings
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax import lax

import spectral_optax as so

F32 = jnp.float32
X = jax.ShapeDtypeStruct((2, 4), F32)


def sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


class Decision(NamedTuple):
    geometry: so.Geometry | None  # None: the trace left the leaf undecided
    reason: str  # the trace's reason (decided: "trace: ...")
    defer: bool  # undecided and deferred to the module hints / name rules (not the element-wise fallback)


def trace_geometry(f, params, *args):
    """``{name: Decision}`` of ``so.GeometryMap.from_apply(f, params, *args)`` for a flat dict of parameters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", so.GeometryWarning)  # the fallback's warning (its own tests elsewhere)
        gm = so.GeometryMap.from_apply(f, params, *args)
        out = {}
        for path, leaf in params.items():
            geometry = gm.resolve([path], [leaf.shape])[0]
            how = gm.decided_by(path, leaf.shape)
            if how.startswith("trace: "):
                out[path] = Decision(geometry, how.split("; ")[0], False)  # less what a name rule said
            else:
                m = re.fullmatch(r"(.*?) \(trace: (.*)\)", how)
                assert m, how
                out[path] = Decision(None, m.group(2), not m.group(1).startswith("fallback"))
    return out


def summary(d):
    g = d.geometry
    assert g is not None, d.reason
    return (g.kind, g.fan_in_axes, g.fan_out_axes, g.batch_axes, g.fan_out_splits, g.role)


def test_unused_parameter_is_deferred_to_the_name_rules():
    """A parameter the traced call never uses is undecided and deferred (silently) to hints / names."""
    dec = trace_geometry(lambda p, x: x @ p["w"], {"w": sds(4, 6), "unused": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")
    assert dec["unused"].geometry is None
    assert dec["unused"].reason == "unused in the traced call"
    assert dec["unused"].defer is True


def test_plain_product_is_a_dot_general_matrix():
    """``x @ w``: contracted axis fan-in, free axis fan-out, reason names dot_general."""
    dec = trace_geometry(lambda p, x: x @ p["w"], {"w": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")
    assert dec["w"].reason == "trace: dot_general, read-out"


def test_ragged_dot_group_axis_is_batch():
    """``ragged_dot``'s rhs (groups, in, out): the group axis is batch, then fan-in and fan-out."""

    def f(p, x, gs):
        return lax.ragged_dot(x, p["w"], gs)

    dec = trace_geometry(f, {"w": sds(3, 4, 6)}, sds(5, 4), sds(3, dtype=jnp.int32))
    assert summary(dec["w"]) == ("matrix", (1,), (2,), (0,), 1, "output")
    assert dec["w"].reason == "trace: dot_general, read-out"


def test_conv_kernel_is_a_matrix():
    """A ``conv_general_dilated`` kernel (HWIO): window x input features fan-in, output features fan-out."""

    def f(p, x):
        return lax.conv_general_dilated(x, p["k"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    dec = trace_geometry(f, {"k": sds(3, 3, 2, 5)}, sds(1, 4, 4, 2))
    assert summary(dec["k"]) == ("matrix", (0, 1, 2), (3,), (), 1, "output")
    assert dec["k"].reason.startswith("trace: conv")


def test_scaled_parameter_is_still_the_parameter():
    """``x @ (w * 0.5)``: a parameter scaled by a constant keeps its geometry."""
    dec = trace_geometry(lambda p, x: x @ (p["w"] * 0.5), {"w": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")


def test_size_one_broadcast_is_not_a_token():
    """``x[None] @ w[None]``: a new axis of size 1 is not a tiling over the batch; w stays a matrix."""
    dec = trace_geometry(lambda p, x: (x[None] @ p["w"][None])[0], {"w": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")


def test_token_tiled_over_the_batch_is_a_constant_input():
    """A learned vector broadcast over the batch (a query probe) is a vector, a constant input."""

    def f(p, x):
        return jnp.concatenate([x, jnp.broadcast_to(p["tok"], (x.shape[0], 3))], axis=1)

    dec = trace_geometry(f, {"tok": sds(3)}, X)
    assert summary(dec["tok"]) == ("vector", (), (0,), (), 1, "hidden")
    assert dec["tok"].reason.endswith("(a constant input)")


def test_parameter_split_before_the_product_in_equal_blocks():
    """A fused kernel cut into two column blocks (``split`` / ``dynamic_slice``), each used by a product."""

    def by_split(p, x):
        a, b = jnp.split(p["w"], 2, axis=1)
        return x @ a, x @ b

    def by_dynamic_slice(p, x):
        a = lax.dynamic_slice(p["w"], (0, 0), (4, 3))
        b = lax.dynamic_slice(p["w"], (0, 3), (4, 3))
        return x @ a, x @ b

    for f, prim in ((by_split, "split"), (by_dynamic_slice, "dynamic_slice")):
        assert prim in str(jax.make_jaxpr(f)({"w": sds(4, 6)}, X))
        dec = trace_geometry(f, {"w": sds(4, 6)}, X)
        assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 2, "output"), prim


def test_size_one_block_contracted_carries_no_axis():
    """A fan-out reshaped (4, 2, 3) and cut into its 2 blocks: the block dim of size 1, contracted with the
    activation, carries nothing of the parameter's axis; the fan-out is 2 blocks of 3."""

    def f(p, x):
        w = p["w"].reshape(4, 2, 3)
        outs = []
        for i in range(2):
            blk = lax.slice(w, (0, i, 0), (4, i + 1, 3))
            outs.append(lax.dot_general(x, blk, (((1, 2), (0, 1)), ((), ()))))
        return outs

    dec = trace_geometry(f, {"w": sds(4, 6)}, sds(2, 4, 1))
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 2, "output")


def test_unequal_split_of_a_product_names_the_fix():
    """A fused q / k / v product split in unequal widths: undecided, the reason says why and the fix."""

    def f(p, x):
        q, k, v = jnp.split(x @ p["w"], [4, 6], axis=1)
        return q + 1.0, k * 2.0, v - 1.0

    dec = trace_geometry(f, {"w": sds(4, 8)}, X)
    assert dec["w"].geometry is None
    r = dec["w"].reason
    assert "(a fused projection of different widths, e.g. grouped-query q / k / v)" in r
    assert "a Geometry splits a fan-out only into equal blocks" in r
    assert "Override it as one matrix, or keep the blocks as separate parameters" in r


def test_rejoined_product_blocks_are_followed_further():
    """A product's halves swapped and re-joined (rotary style), then reshaped: one matrix, no blocks."""

    def f(p, x):
        y = x @ p["w"]
        a, b = y[:, :3], y[:, 3:]
        return jnp.concatenate([b, a], axis=1).reshape(2, 2, 3)

    dec = trace_geometry(f, {"w": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")


def test_second_expert_product_marks_the_first_products_expert_axis_as_batch():
    """``x (n,d) . w1 (e,d,f) -> h (n,e,f)``, then ``h . w2 (e,f,d)`` with h's dim 1 and w2's dim 0 as
    dot_general batch dims: w1's axis 0 (carried by h's dim 1) is a batch axis."""

    def f(p, x):
        h = lax.dot_general(x, p["w1"], (((1,), (1,)), ((), ())))  # (n, e, f)
        return lax.dot_general(h, p["w2"], (((2,), (1,)), ((1,), (0,))))  # (e, n, d)

    dec = trace_geometry(f, {"w1": sds(3, 4, 5), "w2": sds(3, 5, 4)}, X)
    assert summary(dec["w1"]) == ("matrix", (1,), (2,), (0,), 1, "hidden")
    assert summary(dec["w2"]) == ("matrix", (1,), (2,), (0,), 1, "output")


def test_gathered_expert_weights_read_out():
    """Expert weights picked by a gather (``w[idx]``) and used in a product: a matrix with the expert axis
    as batch; its product is the output, so it is the read-out."""

    def f(p, x, idx):
        return jnp.einsum("nd,ndf->nf", x, p["w"][idx])

    dec = trace_geometry(f, {"w": sds(3, 4, 6)}, X, sds(2, dtype=jnp.int32))
    assert summary(dec["w"]) == ("matrix", (1,), (2,), (0,), 1, "output")


def test_axis_used_as_fan_in_and_fan_out_is_undecided():
    """``(x @ w) @ w.T``: each axis is fan-in of one product and fan-out of the other: undecided."""
    dec = trace_geometry(lambda p, x: (x @ p["w"]) @ p["w"].T, {"w": sds(4, 4)}, X)
    assert dec["w"].geometry is None
    assert dec["w"].reason == "axis 0 is used as in and out by different ops"


def test_scan_outputs_over_activations_are_activations():
    """A scan over activation xs: every output (here a carry not computed from xs) is an activation, so a
    product with it is a matrix use."""

    def f(p, x):
        def body(h, xi):
            return h * 2.0, xi.sum()

        h, _ = lax.scan(body, jnp.ones((2, 4), F32), x)
        return h @ p["w"]

    dec = trace_geometry(f, {"w": sds(4, 6)}, sds(3, 5))
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")


def test_readout_followed_through_a_reshaped_parameter():
    """Only parametrized products block the read-out: an output that is a reshape of a parameter tied by
    ``optimization_barrier`` to a product's output still makes that product the read-out."""

    def f(p, x):
        wb, _ = lax.optimization_barrier((p["v"], x @ p["w"]))
        return wb.reshape(24)

    dec = trace_geometry(f, {"w": sds(4, 6), "v": sds(4, 6)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")


def test_readout_followed_through_a_gather_by_parameter_indices():
    """A product's output gathered by a parameter used as indices: that use is opaque, but the gather does
    not block the read-out of the product."""

    def f(p, x):
        return jnp.take(x @ p["w"], p["idx"], axis=1, mode="clip")

    dec = trace_geometry(f, {"w": sds(4, 6), "idx": sds(2, dtype=jnp.int32)}, X)
    assert summary(dec["w"]) == ("matrix", (0,), (1,), (), 1, "output")
    assert dec["idx"].geometry is None
    assert "the parameter used as gather indices" in dec["idx"].reason


def init_decision(module, path):
    """The decision of ``so.init_with_geometry(module, key, x)`` for the (4, 6) parameter at ``path``."""
    variables, gm = so.init_with_geometry(module, jax.random.key(0), jnp.zeros((2, 4), F32))
    flat = {"/".join(k): v for k, v in traverse_util.flatten_dict(variables["params"]).items()}
    assert np.shape(flat[path]) == (4, 6)
    how = gm.decided_by(path, (4, 6))
    assert how.startswith("trace: "), how
    return Decision(gm.resolve([path], [(4, 6)])[0], how.split("; ")[0], False)


class _Product(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x @ self.param("w", nn.initializers.normal(), (4, 6))


class _JittedProduct(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.jit(_Product)(name="inner")(x)


class _DroppedProduct(nn.Module):
    @nn.compact
    def __call__(self, x):
        _ = x @ self.param("w", nn.initializers.normal(), (4, 6))  # the forward pass, dropped
        return jnp.ones(3) * 2.0


def test_init_trace_follows_a_parameter_made_inside_jit():
    """The init trace: a parameter made inside a jitted body (``nn.jit``) and used there is followed into it."""
    dec = init_decision(_JittedProduct(), "inner/w")
    assert summary(dec) == ("matrix", (0,), (1,), (), 1, "output")
    assert dec.reason == "trace: dot_general, read-out"


def test_init_trace_whose_output_carries_no_activation_traces_again():
    """The init trace: an output not computed from the inputs (a forward pass dropped): the init is traced
    again with its output returned, and the product is still decided (hidden: it does not reach it)."""
    dec = init_decision(_DroppedProduct(), "w")
    assert summary(dec) == ("matrix", (0,), (1,), (), 1, "hidden")
    assert dec.reason == "trace: dot_general"


def test_from_matrix_inverts_to_matrix_with_a_non_trivial_permutation():
    """from_matrix puts the axes back for a 3-D geometry whose batch / fan-in / fan-out order is permuted."""
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    g = so.Geometry((2, 3, 5), "matrix", (2,), (1,))  # batch 0, fan-in 2, fan-out 1
    m = np.asarray(so.expert.to_matrix(jnp.asarray(x), g))
    np.testing.assert_array_equal(m, np.transpose(x, (0, 2, 1)))  # independent: (batch, d_in, d_out)
    np.testing.assert_array_equal(np.asarray(so.expert.from_matrix(jnp.asarray(m), g)), x)
