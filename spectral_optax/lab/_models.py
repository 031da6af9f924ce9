"""Model families for the lab: MLPs and residual MLPs over any lab dataset.

A *model* here is a :class:`Model` ``(init, apply, loss)`` of pure functions,
and a *family* is ``size -> Model`` (size = width, or depth, ...). The sweep
harness only sees these, so any Flax Linen / NNX / hand-written model plugs in
through :meth:`Model.from_linen` or by building the three functions.

Parametrizations (``MLP(parametrization=...)``, ``mlp_family(init=...)``):
  * ``'spectral'``: Parametrization 1 (spectral condition). Dense kernels
    ``N(0, gain^2 / d_in * min(1, d_out / d_in))`` (``gain = sqrt(2)`` for
    ReLU), embeddings ``N(0, 1)`` (Theta(1) entries at every width), biases 0.
  * ``'standard'``: Flax's defaults (LeCun-normal kernels, embeddings with std
    ``1 / sqrt(features)``): the standard parametrization (SP) baseline.

Module names follow Flax conventions the geometry inference understands:
``embed`` (an ``nn.Embed``), ``Dense_i`` / ``block_i`` hidden kernels and
``head`` (role ``'output'``).

References:
  Yang, Simon, Bernstein (2023), Parametrization 1. docs/math.md sections 2, 5.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from spectral_optax import GeometryMap, collect_max_logits
from spectral_optax.initializers import spectral_embedding, spectral_normal
from spectral_optax.nn.linen import Embed

__all__ = ["MLP", "Model", "embed_init", "gpt_family", "kernel_init", "loss_for", "mlp_family", "resnet_family"]

INITS = ("spectral", "standard")


# --------------------------------------------------------------------------
# Initializers.
# --------------------------------------------------------------------------
def kernel_init(init: str = "spectral", gain: float = math.sqrt(2.0)):
    """Dense-kernel initializer for parametrization ``init``.

    Args:
      init: ``'spectral'``: :func:`~spectral_optax.initializers.spectral_normal`,
        std ``gain / sqrt(d_in) * min(1, sqrt(d_out / d_in))``;
        ``'standard'``: Flax's LeCun normal, std ``1 / sqrt(d_in)``.
      gain: the spectral init's gain (default ``sqrt(2)``, the ReLU gain);
        ignored for ``'standard'``.

    Returns:
      an initializer ``(key, shape, dtype) -> Array``.
    """
    if init == "standard":
        return nn.initializers.lecun_normal()
    if init != "spectral":
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return spectral_normal(gain=gain)


def embed_init(init: str = "spectral"):
    """Embedding initializer: ``N(0, 1)`` (spectral) or Flax's default (standard).

    Args:
      init: ``'spectral'``: i.i.d. ``N(0, 1)`` entries at every width
        (:func:`~spectral_optax.initializers.spectral_embedding`);
        ``'standard'``: Flax's ``nn.Embed`` default, std
        ``1 / sqrt(features)`` for a ``(vocab, features)`` table.

    Returns:
      an initializer ``(key, shape, dtype) -> Array``.
    """
    if init == "standard":
        return nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
    if init != "spectral":
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return spectral_embedding(std=1.0)


# --------------------------------------------------------------------------
# Models.
# --------------------------------------------------------------------------
class Model(NamedTuple):
    """Pure functions of one model.

    Attributes:
      init: ``key -> params``.
      apply: ``(params, x) -> outputs`` (logits, or a scalar per example).
      loss: ``(params, x, y) -> scalar`` mean loss over the batch.
      loss_with_aux: ``(params, x, y) -> (scalar, aux)``: the same loss and what
        the forward pass recorded beside it (``None``: nothing recorded); a
        Linen module with ``record_max_logits=True`` gives its max attention
        logits (:func:`spectral_optax.collect_max_logits`), for
        :func:`~spectral_optax.lab.sweep`'s ``update_args`` and ``step_metrics``.
    """

    init: Callable[[jax.Array], Any]
    apply: Callable[[Any, jax.Array], jax.Array]
    loss: Callable[[Any, jax.Array, jax.Array], jax.Array]
    loss_with_aux: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]] | None = None

    def shapes(self):
        """The parameter tree as ``jax.ShapeDtypeStruct`` leaves (no compute)."""
        return jax.eval_shape(self.init, jax.random.key(0))

    def geometry(self, example_x, overrides=None) -> GeometryMap:
        """The geometry of this model's parameters, read off its forward pass.

        :meth:`spectral_optax.GeometryMap.from_apply` on ``apply`` and the
        parameter shapes (abstract: no FLOPs); pass it as ``geometry=`` to an
        optimizer.

        Args:
          example_x: an example input batch (an array or ``jax.ShapeDtypeStruct``).
          overrides: ``{regex: override}``, applied before the trace.
        """
        return GeometryMap.from_apply(self.apply, self.shapes(), example_x, overrides=overrides)

    @classmethod
    def from_linen(cls, module: nn.Module, example_x, loss: str | Callable = "xent") -> Model:
        """Wrap a Linen module: ``init`` on ``example_x``; ``loss`` by name or
        ``(outputs, y) -> per-example loss``. A module with ``record_max_logits=True``
        also gives ``loss_with_aux``, the loss with the max logits its attention recorded."""
        per_example = loss_for(loss)
        example_x = jnp.asarray(example_x)

        def init(key):
            return module.init(key, example_x)["params"]

        def apply(params, x):
            return module.apply({"params": params}, x)

        def loss_fn(params, x, y):
            return jnp.mean(per_example(apply(params, x), y))

        if not getattr(module, "record_max_logits", False):
            return cls(init, apply, loss_fn)

        def loss_with_aux(params, x, y):
            out, recorded = module.apply({"params": params}, x, mutable=["intermediates"])
            return jnp.mean(per_example(out, y)), collect_max_logits(recorded)

        return cls(init, apply, loss_fn, loss_with_aux)


def loss_for(loss: str | Callable) -> Callable:
    """Per-example loss ``(outputs, y) -> (batch,)``, computed in float32.

    Args:
      loss: ``'xent'``: softmax cross-entropy of logits against integer
        labels ``y``; ``'mse'``: ``0.5 (f - y)^2`` with the output ``f``
        reshaped to ``y``'s shape (one scalar output per example); or a
        callable ``(outputs, y) -> per-example loss``, returned as is.
    """
    if callable(loss):
        return loss
    if loss == "xent":
        return lambda logits, y: optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
    if loss == "mse":
        return lambda f, y: 0.5 * (f.reshape(y.shape).astype(jnp.float32) - y) ** 2
    raise ValueError(f"loss must be 'xent', 'mse' or a callable, got {loss!r}")


class MLP(nn.Module):
    """An MLP (or residual MLP) over images, vectors or byte contexts.

    Input layer: ``'dense'`` (flattened input -> width) or ``'bytes'`` (each of
    the ``context`` byte ids, offset by its position, indexes one embedding
    table of ``context * 256`` rows; the rows are summed). Then ``depth``
    hidden layers of width ``width``: plain ``h <- act(Dense(h))``, or with
    ``residual=True`` blocks ``h <- h + alpha * Dense(act(Dense(act(h))))``
    (two linear layers per branch, docs/math.md section 5). A ``head`` Dense
    maps to ``num_outputs``.

    Attributes:
      width: width of every hidden layer.
      depth: number of hidden layers (residual blocks with ``residual=True``).
      num_outputs: outputs of the ``head`` (classes, or 1).
      input: ``'dense'`` or ``'bytes'``.
      residual: residual blocks instead of plain layers.
      alpha: branch multiplier (``None``: 1).
      parametrization: ``'spectral'`` or ``'standard'`` (see module docstring).
      use_bias: biases on every Dense (init 0).
      gain: kernel gain for ``'spectral'`` (``sqrt(2)`` for ReLU).
      head_init: override of the head kernel initializer (e.g. zeros).
      dtype: parameter dtype.
      compute_dtype: dtype of the layers' arithmetic (``None``: the
        parameters'); ``jnp.bfloat16`` with float32 parameters is the usual
        mixed precision on GPUs/TPUs. The loss is always taken in float32.
    """

    width: int
    depth: int = 1
    num_outputs: int = 10
    input: str = "dense"
    residual: bool = False
    alpha: float | None = None
    parametrization: str = "spectral"
    use_bias: bool = False
    gain: float = math.sqrt(2.0)
    head_init: Callable | None = None
    dtype: Any = jnp.float32
    compute_dtype: Any = None

    @nn.compact
    def __call__(self, x):
        kinit = kernel_init(self.parametrization, self.gain)
        dense = lambda n, name, k=kinit: nn.Dense(
            n, use_bias=self.use_bias, kernel_init=k, param_dtype=self.dtype, dtype=self.compute_dtype, name=name
        )
        if self.input == "bytes":
            context = x.shape[-1]
            ids = x.astype(jnp.int32) + 256 * jnp.arange(context)
            table = Embed(  # nn.Embed whose lookup also works on Explicit meshes
                context * 256,
                self.width,
                embedding_init=embed_init(self.parametrization),
                param_dtype=self.dtype,
                dtype=self.compute_dtype,
                name="embed",
            )
            h = table(ids).sum(-2)
            if self.parametrization == "spectral":  # a sum of `context` Theta(1) rows: keep RMS ~ 1
                h = h / math.sqrt(context)
        elif self.input == "dense":
            h = x.reshape(x.shape[0], -1) if x.ndim > 1 else x[None]
            cdtype = self.dtype if self.compute_dtype is None else self.compute_dtype
            h = dense(self.width, "Dense_in")(h.astype(cdtype))
        else:
            raise ValueError(f"input must be 'dense' or 'bytes', got {self.input!r}")
        alpha = 1.0 if self.alpha is None else self.alpha
        if self.residual:
            for i in range(self.depth):
                branch = dense(self.width, f"block_{i}_0")(nn.relu(h))
                branch = dense(self.width, f"block_{i}_1")(nn.relu(branch))
                h = h + alpha * branch
            h = nn.relu(h)
        else:
            h = nn.relu(h)
            for i in range(self.depth):
                h = nn.relu(dense(self.width, f"Dense_{i}")(h))
        head_k = self.head_init if self.head_init is not None else kinit
        return dense(self.num_outputs, "head", head_k)(h)


def _check_vary(vary: str) -> None:
    if vary not in ("width", "depth"):
        raise ValueError(f"vary must be 'width' or 'depth', got {vary!r}")


def _sized_family(data, vary: str, width: int, depth: int, build, loss: str = "xent") -> Callable[[int], Model]:
    """``size -> Model.from_linen(build(w, d), example, loss)``: the size is the width ``w`` (depth ``d = depth``)
    when ``vary == 'width'``, else the depth ``d`` (width ``w = width``); the example is ``data``'s first
    training input."""
    example_x, _ = data.numpy_batch("train", [0])

    def family(size: int) -> Model:
        w, d = (size, depth) if vary == "width" else (width, size)
        return Model.from_linen(build(w, d), example_x, loss)

    return family


def mlp_family(
    data,
    *,
    vary: str = "width",
    width: int = 256,
    depth: int = 1,
    residual: bool = False,
    alpha: Callable[[int], float] | float | None = None,
    init: str = "spectral",
    loss: str | None = None,
    **mlp_kwargs,
) -> Callable[[int], Model]:
    """``size -> Model``: MLPs on ``data`` varying ``'width'`` or ``'depth'``.

    Args:
      data: a lab :class:`~spectral_optax.lab.Dataset`.
      vary: which attribute the size sets: ``'width'`` or ``'depth'``.
      width: hidden width when ``vary='depth'``.
      depth: hidden layers (or residual blocks) when ``vary='width'``.
      residual: residual blocks (see :class:`MLP`).
      alpha: branch multiplier, a number or ``depth -> alpha`` (e.g.
        ``lambda K: 2 / K``, the inverse-depth rule).
      init: ``'spectral'`` or ``'standard'``.
      loss: ``'xent'`` / ``'mse'``; default from ``data.kind``.
      **mlp_kwargs: further :class:`MLP` attributes.
    """
    _check_vary(vary)
    loss = loss or ("mse" if data.kind == "regression" else "xent")

    def build(w: int, d: int) -> nn.Module:
        return MLP(
            width=w,
            depth=d,
            num_outputs=data.num_outputs,
            input="bytes" if data.kind == "bytes" else "dense",
            residual=residual,
            alpha=alpha(d) if callable(alpha) else alpha,
            parametrization=init,
            **mlp_kwargs,
        )

    return _sized_family(data, vary, width, depth, build, loss)


def gpt_family(
    data,
    *,
    vary: str = "depth",
    width: int = 64,
    depth: int = 2,
    num_heads: int | None = None,
    head_dim: int = 16,
    scaled: bool = True,
    base_blocks: int = 2,
    init: str = "spectral",
    qkv: str = "fused",
    dtype: Any = None,
    **transformer_kwargs,
) -> Callable[[int], Model]:
    """``size -> Model``: GPT-style decoders (:class:`spectral_optax.nn.linen.Transformer`)
    on a ``'sequence'`` dataset (``lab.text(..., sequence=True)``), varying
    ``'depth'`` (K blocks) or ``'width'``.

    The context length (``max_len``) is ``data.context`` and the vocabulary
    ``data.num_outputs``; the loss is the mean next-token cross-entropy over
    every position.

    Args:
      data: a lab dataset of kind ``'sequence'`` (targets at every position).
      vary: which attribute the size sets: ``'depth'`` (K) or ``'width'``.
      width: model width (``features``) when ``vary='depth'``.
      depth: number of blocks K when ``vary='width'``.
      num_heads: attention heads; default ``max(1, width // head_dim)`` at
        each size.
      head_dim: per-head dimension used for the default ``num_heads``.
      scaled: branches ``h + (base_blocks / K) f(h)`` (True) or ``h + f(h)``.
      base_blocks: the depth at which the scaled branch multiplier is 1.
      init: ``'spectral'`` (Parametrization 1: kernels
        ``spectral_normal(gain=1)``, embeddings ``N(0, 1)``) or ``'standard'``
        (Flax defaults).
      qkv: ``'fused'`` or ``'split'``.
      dtype: computation dtype (e.g. ``jnp.bfloat16`` on accelerators;
        parameters stay float32).
      **transformer_kwargs: further :class:`spectral_optax.nn.linen.Transformer`
        attributes (e.g. ``mlp_ratio``, ``scan``, ``absorbed``; ``record_max_logits=True``
        gives each model a ``loss_with_aux`` returning the max attention logits).
    """
    from spectral_optax.nn.linen import Transformer

    _check_vary(vary)
    if data.kind != "sequence":
        raise ValueError(
            f"gpt_family needs a 'sequence' dataset (lab.text(..., sequence=True)), got kind {data.kind!r}"
        )
    inits = {}
    if init == "spectral":
        inits = {"kernel_init": kernel_init("spectral", gain=1.0), "embedding_init": embed_init("spectral")}
    elif init != "standard":
        raise ValueError(f"init must be one of {INITS}, got {init!r}")

    def build(w: int, d: int) -> nn.Module:
        return Transformer(
            vocab_size=data.num_outputs,
            features=w,
            num_blocks=d,
            num_heads=num_heads or max(1, w // head_dim),
            max_len=data.context,
            base_blocks=base_blocks,
            alpha=None if scaled else 1.0,
            qkv=qkv,
            dtype=dtype,
            **inits,
            **transformer_kwargs,
        )

    return _sized_family(data, vary, width, depth, build)


def resnet_family(
    data,
    *,
    vary: str = "depth",
    width: int = 16,
    depth: int = 2,
    scaled: bool = True,
    base_blocks: int = 2,
    init: str = "spectral",
    dtype: Any = None,
    stages: int = 3,
) -> Callable[[int], Model]:
    """``size -> Model``: CIFAR-style ResNets (:class:`spectral_optax.nn.linen.ResNet`,
    K blocks per stage) on an image dataset (``(H, W, C)`` inputs, e.g.
    ``lab.digits_augmented()`` or ``lab.cifar(dir)``), varying ``'depth'`` (K)
    or ``'width'`` (the first stage's channels).

    Args:
      data: a lab dataset with image inputs (``len(data.input_shape) == 3``).
      vary: which attribute the size sets: ``'depth'`` (K) or ``'width'``.
      width: first-stage channels when ``vary='depth'`` (the stages have
        ``width * (1, 2, 4)``).
      depth: blocks per stage K when ``vary='width'``.
      scaled: branches ``h + (base_blocks / K) f(h)`` (True) or ``h + f(h)``.
      base_blocks: the depth at which the scaled branch multiplier is 1.
      init: ``'spectral'`` (``spectral_normal(gain=sqrt 2)`` kernels, conv
        fan-in = window x in) or ``'standard'`` (Flax defaults).
      dtype: computation dtype (e.g. ``jnp.bfloat16``; ``None``: float32, as
        the parameters).
      stages: stages of K blocks each (``ResNet``'s ``num_stages``; 4 with K = 2, 4, 8: the depth paper's
        8, 16, 32 blocks).
    """
    from spectral_optax.nn.linen import ResNet

    _check_vary(vary)
    if len(data.input_shape) != 3:
        raise ValueError(
            f"resnet_family needs images (H, W, C); got input_shape {data.input_shape} (load CIFAR with flatten=False)"
        )
    inits = {"kernel_init": kernel_init(init)} if init == "spectral" else {}
    kernel_init(init)  # validates `init`

    def build(w: int, d: int) -> nn.Module:
        return ResNet(
            w,
            d,
            data.num_outputs,
            base_blocks=base_blocks,
            alpha=None if scaled else 1.0,
            dtype=dtype,
            num_stages=stages,
            **inits,
        )

    return _sized_family(data, vary, width, depth, build)
