"""Name rules: a parameter's geometry from the names on its path and its siblings' shapes.

Flax's conventions (``kernel``, ``embedding``, ``bias``, ``scale``; module
names ``Dense_0``, ``Conv_1``, ``ConvLocal``, ``query`` / ``key`` / ``value``,
an attention's ``out``, fused ``qkv``) and public code's names (Hugging Face
GPT-2's transposed ``c_attn`` / ``c_fc`` / ``c_proj``, Gemma's einsum weights)
decide the fan-in, fan-out and batch axes; read-out names (``head``,
``lm_head``, ``logits``, ...) and, in a tree that names no head, the
highest-numbered top-level ``Dense_N`` decide the role.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np

from spectral_optax._geometry.overrides import _override_help
from spectral_optax._geometry.types import Geometry, GeometryError, GeometryWarning, UndecidableGeometryError

# Leaf / module names recognised by the inference rules.
_OUTPUT_NAME = re.compile(
    r"^(head|lm_head|output|output_layer|readout|logits|classifier|unembed|unembedding|out_proj_head|final"
    r"|logit_?dense|logits?_(dense|proj|layer)|cls_head|classifier_head|prediction_head)"
    r"(_\d+)?$",
    re.IGNORECASE,
)
# Hugging Face GPT-2's FlaxConv1D layers: kernels stored (features, in), used as x @ kernel.T.
_GPT2_CONV1D_NAME = re.compile(r"^(c_attn|c_fc|c_proj)$")
# Gemma's einsum weights: (leaf or parent name) -> (fan-in, fan-out) axes counted from the end; every
# other axis (the stacked key/value or gate axis, and any layer axis before it) is a batch axis.
_GEMMA_EINSUM = {
    "q_einsum": ((-2,), (-3, -1)),  # (N, D, H): 'BTD,NDH->BTNH'
    "kv_einsum": ((-2,), (-3, -1)),  # (2, K, D, H): 'BSD,CKDH->CBSKH'
    "qkv_einsum": ((-2,), (-3, -1)),  # (3, N, D, H): 'BTD,SNDH->SBTNH'
    "attn_vec_einsum": ((-3, -2), (-1,)),  # (N, H, D): 'BTNH,NHD->BTD'
}
_GEMMA_MIN_NDIM = {"q_einsum": 3, "kv_einsum": 4, "qkv_einsum": 4, "attn_vec_einsum": 3}
_DENSE_NAME = re.compile(r"^(dense|linear)(_\d+)?$", re.IGNORECASE)
_CONV_NAME = re.compile(r"conv", re.IGNORECASE)
# nn.ConvLocal: a separate filter per output position, kernel (*out_positions, window x in, out).
_CONV_LOCAL_NAME = re.compile(r"^conv_?local(_\d+)?$", re.IGNORECASE)
# Llama-style fused projections, often grouped-query (q, k, v blocks of different widths).
_GQA_FUSED_NAME = re.compile(r"^wqkv$", re.IGNORECASE)
# Flax's default name of a Dense layer (the read-out of a classifier that does not name its head).
_DEFAULT_DENSE_NAME = re.compile(r"^Dense_(\d+)$")
_QKV_NAME = re.compile(r"^(query|key|value)$", re.IGNORECASE)
# A fused query/key/value projection: its fan-out is three independent blocks.
_FUSED_QKV_NAME = re.compile(r"^(qkv|qkv_proj|c_attn|wqkv)$", re.IGNORECASE)


def _from_names(path: str, shape: tuple[int, ...], shape_of, resolve_one: Callable) -> Geometry:
    """The geometry that the names on ``path`` decide (rule 5 of :class:`~spectral_optax.GeometryMap`).

    ``shape_of`` maps every path of the tree to its shape (siblings decide: a
    bias takes its kernel's batch axes, GPT-2's ``c_attn`` says which layout its
    block uses); ``resolve_one(path, shape, shape_of)`` decides a sibling by the
    whole resolution order. Raises :class:`UndecidableGeometryError` when no
    rule fits.
    """
    parts = path.split("/")
    leaf = parts[-1].lower()
    parent = parts[-2] if len(parts) > 1 else ""
    grandparent = parts[-3] if len(parts) > 2 else ""
    ndim = len(shape)
    role = "output" if _is_output_path(path) or _default_head(path, shape_of) else "hidden"

    if "embed" in leaf and ndim >= 2:
        return Geometry.embedding(shape, role=role)
    if leaf in ("bias", "scale") or ndim <= 1:
        sibling = "/".join(parts[:-1] + ["kernel"])
        if leaf == "bias" and sibling in shape_of and sibling != path:
            try:
                k = resolve_one(sibling, shape_of[sibling], shape_of)
            except GeometryError:
                # The kernel is undecided: its shape still says whether this bias is its
                # fan-out (a DenseGeneral bias) or stacked copies (nn.scan / nnx.vmap).
                ks = tuple(shape_of[sibling])
                trailing = ndim <= len(ks) and ks[len(ks) - ndim :] == shape
                stacked = ndim >= 2 and len(ks) == ndim + 1 and ks[: ndim - 1] + ks[-1:] == shape
                if stacked and not trailing:
                    return Geometry(shape, "vector", (), (ndim - 1,), role=role)
                if ndim >= 2 and not trailing:
                    raise UndecidableGeometryError(
                        f"cannot infer the geometry of parameter '{path}' with shape {shape}: its kernel "
                        f"{ks} is undecided and the shapes do not say which axes are stacked.\n"
                        + _override_help(path, shape)
                    ) from None
                k = Geometry.vector(shape)
            n_batch = len(k.batch_axes)
            if k.batch_axes == tuple(range(n_batch)) and ndim == n_batch + len(k.fan_out_axes):
                return Geometry(shape, "vector", (), tuple(range(n_batch, ndim)), role=role)
        # A >= 2-D bias / norm scale without a kernel beside it: stacked
        # copies (nn.scan, nnx.vmap) of a vector over its last axis.
        return Geometry(shape, "vector", (), (ndim - 1,) if ndim else (), role=role)
    g_named = _named_layout(parts, shape, shape_of, role)
    if g_named is not None:
        return g_named
    if leaf == "kernel" and _FUSED_QKV_NAME.match(parent):
        splits = _fused_qkv_splits(path, shape, (ndim - 1,))
        return Geometry(shape, "matrix", (ndim - 2,), (ndim - 1,), fan_out_splits=splits, role=role)
    if ndim == 2:
        return Geometry.matrix(shape, role=role)
    if leaf == "kernel":
        if _CONV_LOCAL_NAME.match(parent):  # one (window x in, out) matrix per output position
            return Geometry(shape, "matrix", (ndim - 2,), (ndim - 1,), role=role)
        if _CONV_NAME.search(parent):
            if _conv_local_layout(parts, shape, shape_of):
                return Geometry(shape, "matrix", (ndim - 2,), (ndim - 1,), role=role)
            return Geometry(shape, "matrix", tuple(range(ndim - 1)), (ndim - 1,), role=role)
        if _DENSE_NAME.match(parent):
            return Geometry.matrix(shape, role=role)
        if _QKV_NAME.match(parent):
            return Geometry(shape, "matrix", (ndim - 3,), (ndim - 2, ndim - 1), role=role)
        siblings = ("/".join(parts[:-2] + [n, "kernel"]) for n in ("query", "qkv"))
        if parent.lower() == "out" and ("attention" in grandparent.lower() or any(s in shape_of for s in siblings)):
            return Geometry(shape, "matrix", (ndim - 3, ndim - 2), (ndim - 1,), role=role)
    raise UndecidableGeometryError(
        f"cannot infer the geometry of parameter '{path}' with shape {shape}: no Flax naming "
        f"rule decides which of its {ndim} axes are fan-in, fan-out and batch axes.\n" + _override_help(path, shape)
    )


def _conv_local_layout(parts: list[str], shape: tuple[int, ...], shape_of) -> bool:
    """Whether a kernel under a conv name (not ``ConvLocal``) is read as a ``nn.ConvLocal`` kernel
    ``(*out_positions, window x in, out)`` rather than a conv kernel ``(*window, in, out)``.

    The shapes decide where they can (docs/guide.md): a bias ``(out,)`` beside it is a conv's, a bias
    ``(*out_positions, out)`` a local conv's; without a bias, a kernel whose input axis ``shape[-2]``
    is the output width of another kernel in the tree, or at most 4 (image channels), or whose window
    is ``1 x ... x 1`` (the two readings are the same matrices) is a conv. Otherwise the layouts cannot be
    told apart and give different updates (a ``(9 in, out)`` matrix or 9 ``(in, out)`` matrices): warned
    with the path and the override, and read as a conv.
    """
    bias = shape_of.get("/".join(parts[:-1] + ["bias"]))
    if bias is not None:
        return len(bias) == len(shape) - 1 and tuple(bias) == shape[:-2] + shape[-1:] and len(bias) > 1
    if int(np.prod(shape[:-2])) == 1 or shape[-2] <= 4:
        return False
    outs = {s[-1] for p, s in shape_of.items() if p.split("/")[-1] == "kernel" and len(s) >= 2 and p != "/".join(parts)}
    if shape[-2] in outs:
        return False
    path = "/".join(parts)
    nd = len(shape)
    warnings.warn(
        f"parameter '{path}' with shape {shape}: a kernel under a conv name may be a conv kernel (*window, in, "
        "out) or an nn.ConvLocal kernel (*out_positions, window x in, out), and no bias or sibling layer's width "
        "tells which; the two give different updates. Taken as a conv kernel. Pass the model "
        "(spectral_optax.GeometryMap.from_linen(model, x)), or fix it with an override, e.g. "
        f"geometry={{r'{parts[-2]}/kernel$': dict(kind='matrix', fan_in_axes=({nd - 2},), fan_out_axes=({nd - 1},))}} "
        f"(a ConvLocal: one matrix per output position) or dict(kind='matrix', fan_in_axes={tuple(range(nd - 1))}, "
        f"fan_out_axes=({nd - 1},)) (a conv).",
        GeometryWarning,
        stacklevel=5,
    )
    return False


def _named_layout(parts: list[str], shape: tuple[int, ...], shape_of, role: str) -> Geometry | None:
    """The layouts that public code's parameter names decide without a model (docs/guide.md):
    Hugging Face GPT-2's transposed ``c_attn`` / ``c_fc`` / ``c_proj`` kernels, told from the
    standard layout by ``c_attn``'s (3 d, d) shape, and Gemma's einsum weights. ``None`` if no
    such name; :class:`UndecidableGeometryError` if the name fits but the layout is ambiguous."""
    leaf, parent = parts[-1], parts[-2] if len(parts) > 1 else ""
    ndim = len(shape)
    if leaf == "kernel" and ndim == 2 and _GPT2_CONV1D_NAME.match(parent):
        candidates = ["/".join(parts[:-2] + ["c_attn", "kernel"]), "/".join(parts[:-3] + ["attn", "c_attn", "kernel"])]
        qkv = next((shape_of[c] for c in candidates if c in shape_of and len(shape_of[c]) == 2), None)
        if qkv is None:
            return None
        splits = 3 if parent == "c_attn" else 1
        if qkv[0] == 3 * qkv[1]:  # (3 d, d): the transposed (features, in) layout
            return Geometry(shape, "matrix", (1,), (0,), fan_out_splits=splits, role=role)
        if qkv[1] == 3 * qkv[0]:
            return Geometry(shape, "matrix", (0,), (1,), fan_out_splits=splits, role=role)
        return None
    name = leaf if leaf in _GEMMA_EINSUM or leaf == "gating_einsum" else parent if leaf == "w" else ""
    if name in _GEMMA_EINSUM and ndim >= _GEMMA_MIN_NDIM[name]:
        fan_in, fan_out = _GEMMA_EINSUM[name]
        return Geometry(shape, "matrix", fan_in, fan_out, role=role)
    if name == "gating_einsum" and ndim >= 3:
        # (2, F, H) ('...F,NFH->...NH') or (2, H, F) ('...F,NHF->...NH'): the sibling `linear` (H, F) says which.
        lin = shape_of.get("/".join(parts[:-1] + ["linear"])) if leaf == "gating_einsum" else None
        if lin is not None and len(lin) >= 2 and lin[-2] != lin[-1]:
            if shape[-2:] == (lin[-1], lin[-2]):
                return Geometry(shape, "matrix", (-2,), (-1,), role=role)
            if shape[-2:] == tuple(lin[-2:]):
                return Geometry(shape, "matrix", (-1,), (-2,), role=role)
        raise UndecidableGeometryError(
            f"parameter '{'/'.join(parts)}' with shape {shape}: a Gemma gating einsum is stored (2, F, H) or "
            "(2, H, F) and no sibling 'linear' (H, F) with H != F tells which.\n"
            + _override_help("/".join(parts), shape)
        )
    return None


def _fused_qkv_splits(path: str, shape: tuple[int, ...], fan_out: tuple[int, ...]) -> int:
    """3 for the kernel of a fused QKV projection (``.../qkv/kernel``) whose
    fan-out divides by 3 (query, key and value are separate matrices), else 1."""
    parts = path.split("/")
    if len(parts) < 2 or parts[-1] != "kernel" or not _FUSED_QKV_NAME.match(parts[-2]):
        return 1
    return 3 if int(np.prod([shape[a] for a in fan_out])) % 3 == 0 else 1


def _default_head(path: str, shape_of) -> str | None:
    """The module name (``'Dense_3'``) if ``path`` is a leaf of the guessed read-out of a tree that names
    no head: the highest-numbered top-level ``Dense_N`` with a 2-D kernel, when the tree has other
    layers (another kernel or an embedding) and no module named as a head. ``None`` otherwise."""
    parts = path.split("/")
    if parts[:1] == ["params"]:
        parts = parts[1:]
    if len(parts) != 2 or not _DEFAULT_DENSE_NAME.match(parts[0]):
        return None
    best, others = None, False
    for p, s in shape_of.items():
        q = p.split("/")
        if q[:1] == ["params"]:
            q = q[1:]
        if _is_output_path(p):
            return None
        m = _DEFAULT_DENSE_NAME.match(q[0]) if len(q) == 2 and q[1] == "kernel" and len(s) == 2 else None
        if m is not None:
            others = others or best is not None
            best = int(m.group(1)) if best is None else max(best, int(m.group(1)))
        elif q[-1] == "kernel" or "embed" in q[-1].lower():
            others = True
    if best is None or not others or parts[0] != f"Dense_{best}":
        return None
    return parts[0]


def _default_head_warning(path: str, shape: tuple[int, ...], module: str) -> None:
    kind = "matrix" if path.endswith("kernel") else "vector"
    warnings.warn(
        f"parameter '{path}' with shape {shape}: taken as the read-out (role 'output') because '{module}' is "
        "the highest-numbered top-level Dense_N and no module is named as a head (head, lm_head, logits, "
        "classifier, ...); only the computation says for sure. Pass the model "
        "(spectral_optax.GeometryMap.from_linen(model, x) / from_apply(apply_fn, params, x)), name the layer "
        f"(nn.Dense(..., name='head')), or fix it with an override, e.g. "
        f"geometry={{r'{module}/{path.split('/')[-1]}$': dict(kind='{kind}', role='hidden')}}.",
        GeometryWarning,
        stacklevel=4,
    )


def _gqa_fused_warning(path: str, shape: tuple[int, ...]) -> None:
    warnings.warn(
        f"parameter '{path}' with shape {shape}: a fused '{path.split('/')[-2]}' kernel may hold query, key and "
        "value blocks of different widths (grouped-query attention), which only the forward pass shows; "
        "without it, its fan-out is taken as 3 equal blocks when it divides by 3, else as one matrix. Pass the "
        "model (spectral_optax.GeometryMap.from_linen(model, x) / from_nnx(model, x) / from_apply(apply_fn, "
        "params, x)), or fix it with an override, e.g. "
        f"geometry={{r'{path.split('/')[-2]}/kernel$': dict(kind='matrix', fan_out_splits=1)}} (one matrix).",
        GeometryWarning,
        stacklevel=4,
    )


def _is_output_path(path: str) -> bool:
    """Whether a module on ``path`` (the leaf's own name aside) is named as a read-out."""
    return any(_OUTPUT_NAME.match(part) for part in path.split("/")[:-1])
