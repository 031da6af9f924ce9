"""The read-out is what the loss reads (issue 52), on models that return more than their logits.

Fixtures in the return conventions of public code (written here, nothing vendored):

* Hugging Face's ``FlaxT5ForConditionalGenerationModule`` returns a ``FlaxSeq2SeqLMOutput``
  (``flax.struct.dataclass``) with ``logits`` first and ``encoder_last_hidden_state`` beside it;
* big_vision's ``ViT.__call__`` returns ``(logits, out)``, ``out`` a dict of intermediates (``stem``,
  ``with_posemb``, every encoder block's output, ``encoded``, ``head_input``, ``pre_logits``, ``logits``);
* V-MoE returns ``(logits, metrics)``, ``metrics`` holding the router's auxiliary loss.

Every leaf is checked against a truth table written from the model code: the read-out is the layer
that computes the logits; the encoder's last layers, the intermediates' layers and the router are hidden
(docs/math.md, "The read-out"). A model returning another array first is warned with the selector,
and the selector the warning names gives the truth.
"""

from __future__ import annotations

import re
import warnings

import _modern_fixtures as F
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from test_geometry_modern import vit_truth
from test_trace_geometry import M, V, check_truth, decided, t

import spectral_optax as so
from spectral_optax import GeometryMap

TOKENS = jnp.zeros((2, 6), jnp.int32)
IMAGE = jnp.ones((2, 8, 8, 3))


def params_of(model, *x):
    return model.init(jax.random.key(0), *x)["params"]


def quiet(fn, *a, **kw):
    """``fn(*a, **kw)`` and the GeometryWarnings it gave."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", so.GeometryWarning)
        out = fn(*a, **kw)
    return out, [str(w.message) for w in rec if issubclass(w.category, so.GeometryWarning)]


# ================================================================ encoder-decoder (Hugging Face T5)
@flax.struct.dataclass
class Seq2SeqLMOutput:
    """``FlaxSeq2SeqLMOutput``'s order: logits first, the encoder's last hidden state later."""

    logits: jax.Array
    past_key_values: tuple | None = None
    encoder_last_hidden_state: jax.Array | None = None


class T5Norm(nn.Module):
    @nn.compact
    def __call__(self, x):
        w = self.param("weight", nn.initializers.ones, (x.shape[-1],))
        return w * x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


class T5Attention(nn.Module):
    heads: int = 2

    @nn.compact
    def __call__(self, x, kv):
        d = x.shape[-1]
        dense = lambda n: nn.Dense(d, use_bias=False, name=n)  # noqa: E731
        split = lambda y: y.reshape(*y.shape[:-1], self.heads, -1)  # noqa: E731
        q, k, v = split(dense("q")(x)), split(dense("k")(kv)), split(dense("v")(kv))
        a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), -1)
        return dense("o")(jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(x.shape))


class T5Block(nn.Module):
    cross: bool = False

    @nn.compact
    def __call__(self, x, enc=None):
        d = x.shape[-1]
        y = T5Norm(name="ln_self")(x)
        x = x + T5Attention(name="SelfAttention")(y, y)
        if self.cross:
            x = x + T5Attention(name="EncDecAttention")(T5Norm(name="ln_cross")(x), enc)
        y = nn.Dense(4 * d, use_bias=False, name="wi")(T5Norm(name="ln_ff")(x))
        return x + nn.Dense(d, use_bias=False, name="wo")(jax.nn.relu(y))


class T5(nn.Module):
    """T5 v1.1's shape: a shared embedding, pre-norm blocks, final norms, an untied ``lm_head``."""

    vocab: int = 32
    d: int = 16

    @nn.compact
    def __call__(self, input_ids, decoder_input_ids):
        shared = nn.Embed(self.vocab, self.d, name="shared")
        x = T5Block(name="encoder_block_0")(shared(input_ids))
        enc = T5Norm(name="encoder_final_layer_norm")(x)
        y = T5Block(cross=True, name="decoder_block_0")(shared(decoder_input_ids), enc)
        y = T5Norm(name="decoder_final_layer_norm")(y)
        return Seq2SeqLMOutput(
            logits=nn.Dense(self.vocab, use_bias=False, name="lm_head")(y), encoder_last_hidden_state=enc
        )


def t5_truth():
    truth = {"shared/embedding": t("embedding", (0,), (1,)), "lm_head/kernel": t(M, (0,), (1,), role="output")}
    for stack, attn in (("encoder", ("SelfAttention",)), ("decoder", ("SelfAttention", "EncDecAttention"))):
        blk = f"{stack}_block_0"
        for a in attn:
            truth |= {f"{blk}/{a}/{n}/kernel": t(M, (0,), (1,)) for n in "qkvo"}
        truth |= {f"{blk}/{n}/kernel": t(M, (0,), (1,)) for n in ("wi", "wo")}
        norms = ["ln_self", "ln_ff"] + (["ln_cross"] if stack == "decoder" else [])
        truth |= {f"{blk}/{n}/weight": t(V, (), (0,)) for n in norms}
        truth[f"{stack}_final_layer_norm/weight"] = t(V, (), (0,))
    return truth


# ================================================================ big_vision ViT: (logits, out)
class BigVisionViT(nn.Module):
    """big_vision ``vit.py``'s ``_Model``: a scanned encoder, a MAP head, ``pre_logits`` and ``head``; returns
    ``(logits, out)`` with the intermediates ``out`` dict (its encoder's per-block outputs included)."""

    width: int = 16
    depth: int = 2
    classes: int = 5
    rep_size: int = 16

    @nn.compact
    def __call__(self, image):
        out = {}
        x = out["stem"] = nn.Conv(self.width, (4, 4), strides=4, padding="VALID", name="embedding")(image)
        n, h, w, c = x.shape
        x = x.reshape(n, h * w, c)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
        x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
        x = out["with_posemb"] = x + self.param("pos_embedding", F.init, (1, x.shape[1], c), x.dtype)
        block = nn.remat(F.Encoder1DBlock, prevent_cse=False, static_argnums=())
        scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.depth)
        x, scan_out = scanned(name="encoderblock")(x, None)
        for lyr in range(self.depth):
            out[f"block{lyr:02d}"] = jax.tree.map(lambda o, lyr=lyr: o[lyr], scan_out)
        x = out["encoded"] = nn.LayerNorm(name="encoder_norm")(x)
        x = out["head_input"] = F.MAPHead(name="MAPHead_0")(x[:, 1:]) + x[:, 0]
        x = out["pre_logits"] = jnp.tanh(nn.Dense(self.rep_size, name="pre_logits")(x))
        x = out["logits"] = nn.Dense(self.classes, name="head")(x)
        return x, out


def big_vision_truth():
    return vit_truth() | {"pre_logits/kernel": t(M, (0,), (1,)), "pre_logits/bias": t(V, (), (0,))}


# ================================================================ V-MoE: (logits, metrics)
class MoeMlp(nn.Module):
    """V-MoE's ``MlpMoeBlock``: a router ``dense`` (D, E) without bias, top-k gates, experts stacked
    ``(E, D, F)`` / ``(E, F, D)``, and the router's importance loss in ``metrics``."""

    experts: int = 4
    hidden: int = 32

    @nn.compact
    def __call__(self, x):
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        logits = nn.Dense(self.experts, use_bias=False, name="router")(tokens)
        probs = jax.nn.softmax(logits, -1)
        gates, idx = jax.lax.top_k(probs, 2)
        combine = jnp.sum(jax.nn.one_hot(idx, self.experts) * gates[..., None], axis=1)
        wi = self.param("wi", F.init, (self.experts, d, self.hidden))
        wo = self.param("wo", F.init, (self.experts, self.hidden, d))
        y = jnp.einsum("enf,efd->end", jax.nn.gelu(jnp.einsum("nd,edf->enf", tokens, wi)), wo)
        importance = probs.sum(0)
        aux = jnp.var(importance) / jnp.mean(importance) ** 2
        return jnp.einsum("end,ne->nd", y, combine).reshape(b, s, d), {"auxiliary_loss": aux}


class VMoE(nn.Module):
    d: int = 16
    classes: int = 5

    @nn.compact
    def __call__(self, image):
        x = nn.Conv(self.d, (4, 4), strides=4, padding="VALID", name="embedding")(image)
        x = x.reshape(x.shape[0], -1, self.d)
        metrics = {}
        for i in range(2):
            y = nn.LayerNorm(name=f"block{i}_norm")(x)
            if i == 1:  # a MoE layer every other block
                y, metrics[f"block{i}"] = MoeMlp(name=f"block{i}_moe")(y)
            else:
                y = nn.Dense(self.d, name=f"block{i}_mlp")(y)
            x = x + y
        x = nn.LayerNorm(name="encoder_norm")(x).mean(1)
        logits = nn.Dense(self.classes, name="head")(x)
        metrics["auxiliary_loss"] = sum(m["auxiliary_loss"] for m in metrics.values())
        return logits, metrics


def vmoe_truth():
    ln = {f"{n}/{k}": t(V, (), (0,)) for n in ("block0_norm", "block1_norm", "encoder_norm") for k in ("scale", "bias")}
    return ln | {
        "embedding/kernel": t(M, (0, 1, 2), (3,)),
        "embedding/bias": t(V, (), (0,)),
        "block0_mlp/kernel": t(M, (0,), (1,)),
        "block0_mlp/bias": t(V, (), (0,)),
        "block1_moe/router/kernel": t(M, (0,), (1,)),  # hidden: its output gates features (docs/math.md)
        "block1_moe/wi": t(M, (1,), (2,), (0,)),
        "block1_moe/wo": t(M, (1,), (2,), (0,)),
        "head/kernel": t(M, (0,), (1,), role="output"),
        "head/bias": t(V, (), (0,), role="output"),
    }


CASES = {
    "t5": (T5, (TOKENS, TOKENS), t5_truth, lambda out: out.logits),
    "big_vision_vit": (BigVisionViT, (IMAGE,), big_vision_truth, lambda out: out[0]),
    "vmoe": (VMoE, (IMAGE,), vmoe_truth, lambda out: out[0]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_returned_states_intermediates_and_metrics_are_not_read_outs(name):
    cls, x, truth_fn, select = CASES[name]
    model = cls()
    truth = truth_fn()
    params = params_of(model, *x)
    gmap, warned = quiet(GeometryMap.from_linen, model, *x)
    check_truth(params, gmap, truth)
    assert not warned, warned  # the logits come first: the default is right and nothing to warn
    variables, g1 = so.init_with_geometry(model, jax.random.key(0), *x, output=select)
    check_truth(variables["params"], g1, truth)
    g2 = GeometryMap.from_apply(lambda p, *a: model.apply({"params": p}, *a), params, *x, output=select)
    check_truth(params, g2, truth)


# ================================================================ a model returning its logits second
class FeaturesFirst(nn.Module):
    """Returns ``(features, logits)``: the default (the first array leaf) is not what the loss reads."""

    @nn.compact
    def __call__(self, x):
        h = jax.nn.gelu(nn.Dense(16, name="fc")(x))
        return h, nn.Dense(3, name="classifier_layer")(h)


def features_first_truth(head_role):
    return {  # the features feed the classifier: never a read-out, whatever the loss reads
        "fc/kernel": t(M, (0,), (1,)),
        "fc/bias": t(V, (), (0,)),
        "classifier_layer/kernel": t(M, (0,), (1,), role=head_role),
        "classifier_layer/bias": t(V, (), (0,), role=head_role),
    }


def test_a_model_returning_its_logits_second_is_warned_and_the_named_selector_is_right():
    model, x = FeaturesFirst(), jnp.ones((2, 8))
    params = params_of(model, x)
    gmap, warned = quiet(GeometryMap.from_linen, model, x)
    (msg,) = warned
    assert "out[1]" in msg and "'classifier_layer/kernel'" in msg, msg
    check_truth(params, gmap, features_first_truth("hidden"))  # what the default read, warned
    selector = re.search(r"output=(lambda out: out\S+)", msg).group(1).rstrip(".")
    truth = features_first_truth("output")
    for route in ("linen", "init", "apply", "index"):
        kw = {"output": 1 if route == "index" else eval(selector)}  # noqa: S307 - the warning's own text
        if route == "linen":
            g, w = quiet(GeometryMap.from_linen, model, x, **kw)
        elif route == "init":
            (_, g), w = quiet(so.init_with_geometry, model, jax.random.key(0), x, **kw)
        else:
            g, w = quiet(GeometryMap.from_apply, lambda p, a: model.apply({"params": p}, a), params, x, **kw)
        assert not w, (route, w)
        check_truth(params, g, truth)


def test_a_loss_traced_instead_decides_the_read_out():
    model, x = FeaturesFirst(), jnp.ones((2, 8))
    params = params_of(model, x)
    labels = jnp.array([0, 2])

    def loss(out):
        return optax.softmax_cross_entropy_with_integer_labels(out[1], labels).mean()

    check_truth(params, GeometryMap.from_linen(model, x, output=loss), features_first_truth("output"))
    with pytest.raises(so.GeometryError, match="output="):
        GeometryMap.from_apply(lambda p, a: model.apply({"params": p}, a), params, x, output=1.5)


class NNXFeaturesFirst(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(8, 16, rngs=rngs)
        self.classifier_layer = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.gelu(self.fc(x))
        return {"features": h, "logits": self.classifier_layer(h)}


def test_nnx_selector_by_key():
    model, x = NNXFeaturesFirst(nnx.Rngs(0)), jnp.ones((2, 8))
    params = nnx.state(model, nnx.Param)
    _, warned = quiet(GeometryMap.from_nnx, model, x)
    assert len(warned) == 1 and "out['logits']" in warned[0], warned
    got = decided(params, GeometryMap.from_nnx(model, x, output="logits"))
    assert got["classifier_layer/kernel"][-1] == "output" and got["fc/kernel"][-1] == "hidden"
