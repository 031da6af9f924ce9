"""The coordinate check: relative activation changes of a trained MLP across widths."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spectral_optax._callables import required_positional
from spectral_optax.diagnostics._measures import relative_feature_change
from spectral_optax.initializers import spectral_normal


# --------------------------------------------------------------------------
# Coordinate check.
# --------------------------------------------------------------------------
def coord_check_mlp(
    width: int, *, depth: int = 2, d_in: int = 32, d_out: int = 1, init: str = "spectral", gain: float = math.sqrt(2.0)
):
    """The coordinate-check model: a bias-free ReLU MLP ``d_in -> width^depth -> d_out``.

    Returns ``(init_fn, features_fn)``: ``init_fn(key) -> params`` (a dict
    ``{'Dense_0': {'kernel'}, ..., 'head': {'kernel'}}`` in Flax layout) and
    ``features_fn(params, x) -> {'h1': ..., 'h<depth>': ..., 'out': ...}``
    (post-ReLU hidden activations and the output).

    ``init='spectral'``: Parametrization 1, std ``gain / sqrt(d_in) *
    min(1, sqrt(d_out / d_in))`` per layer; ``init='standard'``: Kaiming
    (SP), std ``gain / sqrt(d_in)`` for every layer (``d_in``, ``d_out``:
    that layer's fan-in and fan-out).

    Args:
      width: width of every hidden layer.
      depth: number of hidden layers (``depth + 1`` weight matrices).
      d_in: input dimension.
      d_out: output dimension.
      init: ``'spectral'`` or ``'standard'`` (above).
      gain: the init gain; the default ``sqrt(2)`` is the ReLU gain.
    """
    if init not in ("spectral", "standard"):
        raise ValueError(f"init must be 'spectral' or 'standard', got {init!r}")
    dims = [d_in] + [width] * depth + [d_out]
    names = [f"Dense_{i}" for i in range(depth)] + ["head"]

    # The package's own initializers: Parametrization 1 or Kaiming (SP).
    if init == "spectral":
        kernel_init = spectral_normal(gain=gain)
    else:
        kernel_init = jax.nn.initializers.variance_scaling(gain**2, "fan_in", "normal")

    def init_fn(key):
        keys = jax.random.split(key, len(names))
        return {
            name: {"kernel": kernel_init(k, (a, b), jnp.float32)}
            for k, name, a, b in zip(keys, names, dims[:-1], dims[1:])
        }

    def features_fn(params, x):
        feats = {}
        h = x
        for i in range(depth):
            h = jax.nn.relu(h @ params[f"Dense_{i}"]["kernel"])
            feats[f"h{i + 1}"] = h
        feats["out"] = h @ params["head"]["kernel"]
        return feats

    return init_fn, features_fn


@dataclasses.dataclass
class CoordCheck:
    """Result of :func:`coord_check`.

    Attributes:
      widths: the widths.
      table: ``{layer: [mean over seeds per width]}``: ``||dh|| / ||h||`` for
        hidden layers ``h1..``; for the output ``out`` the absolute RMS
        change ``rms(f_t - f_0)`` (``f_0`` itself shrinks with width under muP).
      std: same layout, standard deviation over seeds.
      steps: training steps taken.
    """

    widths: list[int]
    table: dict[str, list[float]]
    std: dict[str, list[float]]
    steps: int
    name: str = ""

    def ratio(self, layer: str) -> float:
        """``max / min`` over widths of a layer's relative change (inf if any
        entry is non-finite or 0)."""
        v = np.asarray(self.table[layer], float)
        if not np.all(np.isfinite(v)) or v.min() <= 0:
            return float("inf")
        return float(v.max() / v.min())

    def growth(self, layer: str) -> float:
        """Last width's value over the first width's."""
        v = np.asarray(self.table[layer], float)
        return float(v[-1] / v[0]) if v[0] > 0 else float("inf")

    def format(self) -> str:
        """A plain-text table (widths as columns)."""
        head = f"{self.name or 'coord check'} (relative change after {self.steps} steps)"
        lines = [head, "layer  " + " ".join(f"{w:>9d}" for w in self.widths)]
        for layer, vals in self.table.items():
            lines.append(f"{layer:6s} " + " ".join(f"{v:9.3g}" for v in vals))
        return "\n".join(lines)

    def plot(self, path=None, *, ax=None, title=None):
        """Relative change vs width (log-log), one line per layer."""
        import matplotlib

        matplotlib.use("Agg") if ax is None and path is not None else None
        import matplotlib.pyplot as plt

        fig = None
        if ax is None:
            fig, ax = plt.subplots(figsize=(3.6, 2.8))
        for layer, vals in self.table.items():
            ax.errorbar(self.widths, vals, yerr=self.std[layer], marker="o", ms=3, capsize=2, label=layer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width")
        ax.set_ylabel("||dh|| / ||h||")
        ax.set_title(title if title is not None else self.name, fontsize=9)
        ax.legend(fontsize=7, frameon=False)
        ax.grid(alpha=0.3, which="both", lw=0.4)
        if fig is not None and path is not None:
            fig.savefig(path, dpi=90, bbox_inches="tight")
            plt.close(fig)
        return ax


def _call_with_base(factory, width, base):
    n = required_positional(factory, default=1)
    return factory(width, base) if n is not None and n >= 2 else factory(width)


def coord_check(
    optimizer: optax.GradientTransformation | Callable,
    widths: Sequence[int] = (64, 128, 256, 512, 1024),
    *,
    init: str = "spectral",
    steps: int = 3,
    depth: int = 2,
    d_in: int = 32,
    batch_size: int = 32,
    seeds: Sequence[int] = (0, 1, 2),
    data: tuple[np.ndarray, np.ndarray] | None = None,
    name: str = "",
    plot: str | None = None,
) -> CoordCheck:
    """Coordinate check: relative activation change per layer across widths.

    Trains the bias-free ReLU MLP of
    :func:`~spectral_optax.diagnostics.coord_check_mlp` (``d_in ->
    width x depth -> 1``) for ``steps`` full-batch steps of the mean squared
    error ``0.5 (f - y)^2`` on a fixed batch, then measures
    ``||h_t - h_0||_F / ||h_0||_F`` on that batch for every hidden layer (and
    the RMS output change ``rms(f_t - f_0)``), averaged over ``seeds``. Under muP / the spectral condition
    each row of the table is flat in width; under the standard
    parametrization with one learning rate it grows.

    Args:
      optimizer: an ``optax.GradientTransformation`` (same at every width) or
        a factory ``width -> transform`` or ``(width, base_params) -> transform``,
        where ``base_params`` are the model's parameter shapes at
        ``widths[0]`` (e.g. ``lambda n, base: so.mup_sgd(0.1, base=base)``).
      widths: widths to compare (increasing).
      init: ``'spectral'`` (Parametrization 1) or ``'standard'`` (Kaiming, SP).
      steps: optimizer steps.
      depth: number of hidden layers.
      d_in: input dimension (ignored when ``data`` is given).
      batch_size: examples in the fixed batch (ignored when ``data`` is given).
      seeds: initialization seeds to average over.
      data: ``(x, y)`` with ``x: (batch, d_in)``, ``y: (batch,)``; default a
        fixed Gaussian batch with +-1 targets.
      name: label for the table and plot.
      plot: save a log-log plot there when given.

    Returns:
      a :class:`~spectral_optax.diagnostics.CoordCheck` (``.table``, ``.ratio(layer)``, ``.format()``,
      ``.plot()``).
    """
    widths = [int(w) for w in widths]
    if data is None:
        kx, ky = jax.random.split(jax.random.key(1234))
        x = jax.random.normal(kx, (batch_size, d_in), jnp.float32)
        y = jnp.where(jax.random.bernoulli(ky, 0.5, (batch_size,)), 1.0, -1.0)
    else:
        x, y = jnp.asarray(data[0], jnp.float32), jnp.asarray(data[1], jnp.float32)
        d_in = x.shape[-1]
    base_init, _ = coord_check_mlp(widths[0], depth=depth, d_in=d_in, init=init)
    base = jax.eval_shape(base_init, jax.random.key(0))
    seeds_arr = jnp.asarray(list(seeds), jnp.uint32)
    table: dict[str, list[float]] = {}
    std: dict[str, list[float]] = {}
    for width in widths:
        init_fn, features_fn = coord_check_mlp(width, depth=depth, d_in=d_in, init=init)
        opt = (
            optimizer
            if isinstance(optimizer, optax.GradientTransformation)
            else _call_with_base(optimizer, width, base)
        )

        def loss_fn(params):
            f = features_fn(params, x)["out"][:, 0]
            return 0.5 * jnp.mean((f - y) ** 2)

        def run(seed):
            params0 = init_fn(jax.random.key(seed))

            def step(carry, _):
                params, state = carry
                grads = jax.grad(loss_fn)(params)
                updates, state = opt.update(grads, state, params)
                return (optax.apply_updates(params, updates), state), None

            (params, _), _ = jax.lax.scan(step, (params0, opt.init(params0)), None, length=steps)
            new, old = features_fn(params, x), features_fn(params0, x)
            change = relative_feature_change(
                {k: v for k, v in new.items() if k != "out"},
                {k: v for k, v in old.items() if k != "out"},
            )
            # The output starts near 0 under muP (f_0 ~ n^-1/2), so its change is
            # absolute: RMS over the batch of f_t - f_0.
            change["out"] = jnp.sqrt(jnp.mean((new["out"] - old["out"]) ** 2))
            return change

        changes = jax.device_get(jax.jit(jax.vmap(run))(seeds_arr))
        for layer, vals in changes.items():
            vals = np.asarray(vals, float)
            vals = np.where(np.isfinite(vals), vals, np.inf)
            table.setdefault(layer, []).append(float(np.mean(vals)))
            std.setdefault(layer, []).append(float(np.std(vals)) if np.all(np.isfinite(vals)) else float("nan"))
    order = sorted((k for k in table if k != "out"), key=lambda k: int(k[1:])) + ["out"]
    result = CoordCheck(widths, {k: table[k] for k in order}, {k: std[k] for k in order}, steps, name)
    if plot is not None:
        result.plot(plot)
    return result
