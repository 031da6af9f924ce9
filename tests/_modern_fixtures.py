"""Models people train today, written here in the styles of public Flax code (nothing is vendored).

* Rotary embeddings: Gemma's ``apply_rope`` (the head dimension split in
  halves, rotated, concatenated) on einsum heads (``q_einsum`` ``'BTD,NDH->BTNH'``,
  ``kv_einsum`` ``'BSD,CKDH->CBSKH'``, fused ``qkv_einsum`` ``'BTD,SNDH->SBTNH'``),
  in Linen and in NNX; Llama's interleaved pairs (``reshape(..., -1, 2)``) and
  the complex rotation (``lax.complex`` times ``jnp.exp(1j * angle)``) on
  ``DenseGeneral`` heads.
* A big_vision style ViT: a ``Conv`` patch embedding, a class token, a learned
  position table, ``nn.scan(nn.remat(Block))`` whose body returns ``(x, out)``
  (per-layer outputs the model drops), a MAP head whose ``(1, 1, D)`` probe is
  tiled over the batch and used as the attention query, a ``head``.
* An ``nnx.scan`` encoder whose body returns per-layer outputs.
* flax imagenet's ``_ResNet1Local`` style: an ``nn.ConvLocal`` stem named ``conv_init``.
* Mixture-of-experts: expert stacks ``(E, D, F)`` applied by ``jnp.einsum``, by
  ``jax.lax.ragged_dot`` and by gathered expert weights, a router ``(D, E)``,
  a shared expert, the blocks stacked by ``nn.scan``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

init = nn.initializers.normal(0.02)


# ================================================================ rotary embeddings
def rope_halves(x, positions, base=10_000):
    """Gemma's style: split the head dimension in halves, rotate, concatenate. ``x``: (B, T, N, H)."""
    h = x.shape[-1]
    frac = 2 * jnp.arange(h // 2) / h
    angle = positions[..., None] / base**frac  # (B, T, H/2)
    sin, cos = jnp.sin(angle)[..., None, :], jnp.cos(angle)[..., None, :]
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rope_pairs(x, positions, base=10_000):
    """Llama's style: rotate interleaved pairs (``reshape(..., -1, 2)``), reshape back."""
    h = x.shape[-1]
    angle = positions[..., None] / base ** (jnp.arange(h // 2) * 2 / h)
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(x.shape)


def rope_complex(x, positions, base=10_000):
    """The complex rotation: pairs as complex numbers times ``exp(1j * angle)``."""
    h = x.shape[-1]
    angle = positions[..., None] / base ** (jnp.arange(h // 2) * 2 / h)
    rot = jnp.exp(1j * angle)[:, :, None, :]
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    z = jax.lax.complex(pairs[..., 0], pairs[..., 1]) * rot
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).reshape(x.shape).astype(x.dtype)


def attend(q, k, v):
    """Causal attention on (B, T, N, H) heads, grouped-query when k / v have fewer heads."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, n // kv, h)
    logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k) / np.sqrt(h)
    logits = jnp.where(jnp.tril(jnp.ones((t, t), bool))[:, None, None, :], logits, -1e9)
    return jnp.einsum("BTKGS,BSKH->BTKGH", jax.nn.softmax(logits, -1), v).reshape(b, t, n, h)


class EinsumW(nn.Module):
    """A parametrized einsum whose weight is named ``w`` (Gemma's Linen layers)."""

    shape: tuple

    @nn.compact
    def __call__(self, eqn, x):
        return jnp.einsum(eqn, x, self.param("w", init, self.shape))


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x**2, -1, keepdims=True) + 1e-6) * (1 + scale)


class GemmaRopeAttention(nn.Module):
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    fused: bool = False  # qkv_einsum 'BTD,SNDH->SBTNH' (heads == kv_heads)

    @nn.compact
    def __call__(self, x, positions):
        d = x.shape[-1]
        if self.fused:
            q, k, v = EinsumW((3, self.heads, d, self.head_dim), name="qkv_einsum")("BTD,SNDH->SBTNH", x)
        else:
            q = EinsumW((self.heads, d, self.head_dim), name="q_einsum")("BTD,NDH->BTNH", x)
            k, v = EinsumW((2, self.kv_heads, d, self.head_dim), name="kv_einsum")("BSD,CKDH->CBSKH", x)
        q, k = rope_halves(q, positions), rope_halves(k, positions)
        enc = attend(q, k, v)
        return EinsumW((self.heads, self.head_dim, d), name="attn_vec_einsum")("BTNH,NHD->BTD", enc)


class GemmaRope(nn.Module):
    """Gemma-style decoder with RoPE; tied decode."""

    vocab: int = 40
    d: int = 32
    layers: int = 2
    fused: bool = False

    @nn.compact
    def __call__(self, tokens):
        table = self.param("input_embedding", init, (self.vocab, self.d))
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape).astype(jnp.float32)
        x = table[(tokens,)] * np.sqrt(self.d)
        for i in range(self.layers):
            heads = dict(heads=4, kv_heads=4) if self.fused else {}
            attn = GemmaRopeAttention(fused=self.fused, name=f"layer_{i}_attn", **heads)
            x = x + attn(RMSNorm(name=f"layer_{i}_pre_attention_norm")(x), positions)
            h = RMSNorm(name=f"layer_{i}_pre_ffw_norm")(x)
            g = jnp.einsum("...F,NFH->...NH", h, self.param(f"layer_{i}_gating_einsum", init, (2, self.d, 64)))
            x = x + jnp.einsum("...H,HF->...F", jax.nn.gelu(g[..., 0, :]) * g[..., 1, :],
                               self.param(f"layer_{i}_linear", init, (64, self.d)))  # fmt: skip
        return RMSNorm(name="final_norm")(x) @ table.T


class DenseHeadsRope(nn.Module):
    """Llama-style attention on DenseGeneral heads: rope by interleaved pairs or complex rotation; a head."""

    vocab: int = 40
    d: int = 32
    heads: int = 4
    style: str = "pairs"  # or 'complex'

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d, name="tok_embeddings")(tokens)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape).astype(jnp.float32)
        rope = rope_pairs if self.style == "pairs" else rope_complex
        for i in range(2):
            h = RMSNorm(name=f"attention_norm_{i}")(x)
            q, k, v = (nn.DenseGeneral((self.heads, self.d // self.heads), use_bias=False, name=f"w{n}_{i}")(h)
                       for n in "qkv")  # fmt: skip
            a = attend(rope(q, positions), rope(k, positions), v)
            x = x + nn.DenseGeneral(self.d, axis=(-2, -1), use_bias=False, name=f"wo_{i}")(a)
        return nn.Dense(self.vocab, use_bias=False, name="output")(RMSNorm(name="norm")(x))


class NNXRopeBlock(nnx.Module):
    def __init__(self, d, heads, kv_heads, head_dim, rngs):
        self.pre_attention_norm = nnx.RMSNorm(d, rngs=rngs)
        self.q_einsum = nnx.Einsum("BTD,NDH->BTNH", (heads, d, head_dim), rngs=rngs)
        self.kv_einsum = nnx.Einsum("BSD,CKDH->CBSKH", (2, kv_heads, d, head_dim), rngs=rngs)
        self.attn_vec_einsum = nnx.Einsum("BTNH,NHD->BTD", (heads, head_dim, d), rngs=rngs)

    def __call__(self, x, positions):
        h = self.pre_attention_norm(x)
        k, v = self.kv_einsum(h)
        q = rope_halves(self.q_einsum(h), positions)
        return x + self.attn_vec_einsum(attend(q, rope_halves(k, positions), v))


class NNXGemmaRope(nnx.Module):
    """flax's NNX Gemma example's shape: ``model(tokens, positions)``, RoPE by halves, tied decode."""

    def __init__(self, rngs, vocab=40, d=32, layers=2):
        self.embedder = nnx.Embed(vocab, d, rngs=rngs)
        self.layers = nnx.List([NNXRopeBlock(d, 4, 2, 8, rngs) for _ in range(layers)])
        self.final_norm = nnx.RMSNorm(d, rngs=rngs)

    def __call__(self, tokens, positions):
        x = self.embedder(tokens)
        for layer in self.layers:
            x = layer(x, positions)
        return self.embedder.attend(self.final_norm(x))


# ================================================================ big_vision style ViT
class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        return nn.Dense(d)(nn.gelu(nn.Dense(self.mlp_dim)(x)))


class Encoder1DBlock(nn.Module):
    """The body of the scanned encoder: returns ``(x, out)``, ``out`` the per-layer outputs."""

    mlp_dim: int = 64
    heads: int = 2

    @nn.compact
    def __call__(self, x, _):
        out = {}
        y = nn.LayerNorm()(x)
        y = out["sa"] = nn.MultiHeadDotProductAttention(num_heads=self.heads)(y, y)
        x = out["+sa"] = x + y
        y = out["mlp"] = MlpBlock(self.mlp_dim, name="MlpBlock_0")(nn.LayerNorm()(x))
        x = out["+mlp"] = x + y
        return x, out


class MAPHead(nn.Module):
    """Multihead attention pooling: a learned ``(1, 1, D)`` probe, tiled over the batch, is the query."""

    heads: int = 2

    @nn.compact
    def __call__(self, x):
        n, _, d = x.shape
        probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
        probe = jnp.tile(probe, [n, 1, 1])
        x = nn.MultiHeadDotProductAttention(num_heads=self.heads)(probe, x)
        y = nn.LayerNorm()(x)
        return (x + MlpBlock(2 * d, name="MlpBlock_0")(y))[:, 0]


class ScanViT(nn.Module):
    """Conv patches, class token, position table, ``nn.scan(nn.remat(Encoder1DBlock))``, MAP head, head."""

    width: int = 16
    depth: int = 2
    classes: int = 5
    patch: int = 4

    @nn.compact
    def __call__(self, image):
        x = nn.Conv(self.width, (self.patch, self.patch), strides=self.patch, padding="VALID", name="embedding")(image)
        n, h, w, c = x.shape
        x = x.reshape(n, h * w, c)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
        x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
        x = x + self.param("pos_embedding", nn.initializers.normal(0.02), (1, x.shape[1], c), x.dtype)
        block = nn.remat(Encoder1DBlock, prevent_cse=False, static_argnums=())
        scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.depth)
        x, _ = scanned(name="encoderblock")(x, None)  # the per-layer outputs are dropped
        x = nn.LayerNorm(name="encoder_norm")(x)
        x = MAPHead(name="MAPHead_0")(x[:, 1:]) + x[:, 0]
        return nn.Dense(self.classes, name="head")(x)


class NNXScanBlock(nnx.Module):
    def __init__(self, d, rngs):
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.fc1 = nnx.Linear(d, 2 * d, rngs=rngs)
        self.fc2 = nnx.Linear(2 * d, d, rngs=rngs)

    def __call__(self, x):
        y = self.fc2(nnx.gelu(self.fc1(self.norm(x))))
        return x + y, y  # (carry, per-layer output)


class NNXScanEncoder(nnx.Module):
    """``nnx.scan`` over ``nnx.vmap``-made blocks whose body returns per-layer outputs the model drops."""

    def __init__(self, rngs, d=16, depth=3, classes=5):
        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(r):
            return NNXScanBlock(d, r)

        self.stem = nnx.Linear(8, d, rngs=rngs)
        self.blocks = make(rngs)
        self.classifier = nnx.Linear(d, classes, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def body(h, block):
            return block(h)

        h, _per_layer = body(self.stem(x), self.blocks)
        return self.classifier(h.mean(1))


# ================================================================ ConvLocal from plain params
class ResNet1Local(nn.Module):
    """flax imagenet's ``_ResNet1Local`` shape: a ConvLocal stem under the neutral name ``conv_init``."""

    @nn.compact
    def __call__(self, x):
        x = nn.ConvLocal(8, (3, 3), padding="SAME", use_bias=False, name="conv_init")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True, name="bn_init")(x))
        x = nn.relu(nn.Conv(8, (3, 3), use_bias=False, name="conv_1")(x))
        return nn.Dense(4, name="head")(jnp.mean(x, axis=(1, 2)))


# ================================================================ mixture of experts
class MoE(nn.Module):
    """Top-k routed experts, a router ``(D, E)`` and a shared expert; the experts applied three ways."""

    experts: int = 4
    hidden: int = 32
    top_k: int = 2
    how: str = "einsum"  # 'einsum' (dense dispatch), 'ragged' (jax.lax.ragged_dot), 'gather'

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        e, f = self.experts, self.hidden
        router = self.param("router", init, (d, e))
        w_in = self.param("wi", init, (e, d, f))
        w_out = self.param("wo", init, (e, f, d))
        tokens = x.reshape(b * t, d)
        gates, idx = jax.lax.top_k(jax.nn.softmax(tokens @ router, -1), self.top_k)  # (N, k)
        if self.how == "einsum":
            combine = jnp.sum(jax.nn.one_hot(idx, e) * gates[..., None], axis=1)  # (N, E)
            h = jax.nn.gelu(jnp.einsum("nd,edf->enf", tokens, w_in))
            y = jnp.einsum("enf,efd->end", h, w_out)
            out = jnp.einsum("end,ne->nd", y, combine)
        elif self.how == "ragged":
            flat = idx.reshape(-1)  # (N k,)
            order = jnp.argsort(flat)
            xs = jnp.repeat(tokens, self.top_k, axis=0)[order]
            sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
            h = jax.nn.gelu(jax.lax.ragged_dot(xs, w_in, sizes))
            y = jax.lax.ragged_dot(h, w_out, sizes)
            y = jnp.zeros_like(y).at[order].set(y).reshape(b * t, self.top_k, d)
            out = jnp.sum(y * gates[..., None], axis=1)
        else:  # gathered expert weights: each token's k experts' matrices
            wi, wo = w_in[idx], w_out[idx]  # (N, k, D, F), (N, k, F, D)
            h = jax.nn.gelu(jnp.einsum("nd,nkdf->nkf", tokens, wi))
            out = jnp.einsum("nkf,nkfd,nk->nd", h, wo, gates)
        shared = nn.Dense(d, use_bias=False, name="shared_out")(
            jax.nn.gelu(nn.Dense(f, use_bias=False, name="shared_in")(tokens))
        )
        return (out + shared).reshape(b, t, d)


class MoEBlock(nn.Module):
    how: str = "einsum"
    experts: int = 4
    hidden: int = 32

    @nn.compact
    def __call__(self, x, _):
        moe = MoE(self.experts, self.hidden, how=self.how, name="moe")
        return x + moe(nn.LayerNorm(name="norm")(x)), None


class MoELM(nn.Module):
    """Embedding, ``nn.scan`` over MoE blocks, a head."""

    vocab: int = 40
    d: int = 16
    layers: int = 2
    how: str = "einsum"
    experts: int = 4
    hidden: int = 32

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d, name="embed")(tokens)
        blocks = nn.scan(MoEBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers)
        x, _ = blocks(self.how, self.experts, self.hidden, name="blocks")(x, None)
        return nn.Dense(self.vocab, name="lm_head")(x)
