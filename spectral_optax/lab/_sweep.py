"""Vmapped learning-rate sweeps with resumable JSONL results.

One call of :func:`sweep` trains a model family over a list of sizes and an
LR grid with several seeds. For each size, every (LR, seed) run still missing
from the results file trains in **one compiled program** (``vmap`` over the
runs, ``lax.scan`` over the steps, in a few chunks so a progress bar can
move). Every finished run is appended as one JSON line; rerunning the same
call after an interruption skips the runs already recorded, so nothing is
redone or lost (a half-written last line is ignored with a warning).

Per run it records the final train loss (mean minibatch loss over the last
5% of steps), the validation loss (on a fixed slice of the validation set),
a short loss curve (and with ``val_curve=True`` the validation loss after
every chunk), the steady-state seconds per step, and ``diverged`` (a
non-finite loss: such runs are kept, never dropped).

**Schedules.** ``schedule='warmup_cosine'`` trains every run with the LR
``lr_t = lr * m(t)``: linear warm-up from 0 over the first 5% of the steps,
then a cosine decay to 0 (:func:`warmup_cosine`); the grid is over the
*peak* LR ``lr``. It is applied as a multiplier on the optimizer's update
(``optax.scale_by_schedule`` after it), which equals scheduling the LR for
every optimizer whose update is ``-lr * u_t`` with ``u_t`` independent of
``lr`` (SGD, Adam(W) without weight decay, Muon, MOGA); with decoupled
weight decay the decay is scheduled too (as in ``optax.adamw`` with a
schedule).

:func:`summarize` turns runs into the best LR per size and the **spread in
grid steps** ``log2(max best LR / min best LR) / log2(grid ratio)``, with the
best LR refined by a parabola through the grid minimum and its two
neighbours in log-LR. It also reports the loss at the best LR: the best LR is
only meaningful where that loss stays clearly above the task's floor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spectral_optax._callables import required_positional
from spectral_optax.lab._plots import plot_sweep
from spectral_optax.lab._summary import summarize

__all__ = ["SCHEDULES", "SweepResult", "append_run", "load_runs", "sweep", "warmup_cosine"]

SCHEDULES = ("constant", "warmup_cosine")


# --------------------------------------------------------------------------
# Schedules (multipliers of the peak LR).
# --------------------------------------------------------------------------
def warmup_cosine(steps: int, warmup: float = 0.05, final: float = 0.0) -> optax.Schedule:
    """LR multiplier ``m(t)``: ``(t + 1) / W`` for ``t < W`` (linear warm-up over
    ``W = max(1, round(warmup * steps))`` steps), then
    ``final + (1 - final) * (1 + cos(pi * (t - W) / (steps - W))) / 2``.

    ``m`` peaks at 1 (the grid LR is the peak LR), is positive at step 0 (no
    wasted step) and reaches ``final`` at ``t = steps``.

    Args:
      steps: total training steps (``>= 1``).
      warmup: fraction of ``steps`` spent warming up, in ``[0, 1)`` (at least
        one step).
      final: the multiplier at the end of the cosine, in ``[0, 1]`` (``0``:
        decay to zero).

    Returns:
      a schedule ``t -> m(t)`` (float32), usable under ``jit``.
    """
    if steps < 1 or not 0 <= warmup < 1 or not 0 <= final <= 1:
        raise ValueError(
            f"warmup_cosine: need steps >= 1, 0 <= warmup < 1, 0 <= final <= 1; got "
            f"steps={steps}, warmup={warmup}, final={final}"
        )
    w = max(1, round(warmup * steps))
    decay = max(1, steps - w)

    def m(t):
        t = jnp.asarray(t, jnp.float32)
        ramp = (t + 1) / w
        cos = final + (1 - final) * 0.5 * (1 + jnp.cos(jnp.pi * jnp.clip(t - w, 0, decay) / decay))
        return jnp.where(t < w, ramp, cos)

    return m


def _schedule_fn(schedule, steps: int):
    """(name recorded with the runs, multiplier schedule or None)."""
    if schedule is None or schedule == "constant":
        return "constant", None
    if schedule == "warmup_cosine":
        return "warmup_cosine", warmup_cosine(steps)
    if callable(schedule):
        return getattr(schedule, "__name__", repr(schedule)), schedule
    raise ValueError(f"schedule must be one of {SCHEDULES} or a callable step -> multiplier, got {schedule!r}")


# --------------------------------------------------------------------------
# Results file.
# --------------------------------------------------------------------------
def _json_float(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _json_array(a):
    """A float, or nested lists of floats, of a scalar or array (non-finite: ``None``)."""
    a = np.asarray(a)
    return _json_float(a) if a.ndim == 0 else [_json_array(v) for v in a]


def load_runs(path: str | os.PathLike | None) -> list[dict]:
    """Read a JSONL results file (missing file: no runs). Malformed lines (a
    run interrupted while writing) are skipped with a warning.

    Args:
      path: the results file written by :func:`sweep` / :func:`append_run`;
        ``None`` or a missing file gives ``[]``.

    Returns:
      one dict per run record (a JSON object with at least ``lr`` and
      ``size``), in file order.
    """
    if path is None or not os.path.exists(path):
        return []
    runs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or "lr" not in rec or "size" not in rec:
                    raise ValueError("not a run record")
            except ValueError:
                warnings.warn(f"{path}:{n}: skipping a malformed results line (interrupted write?)", stacklevel=2)
                continue
            runs.append(rec)
    return runs


def append_run(path: str | os.PathLike, record: dict) -> None:
    """Append one run as one JSON line (flushed and fsynced).

    The file and its directory are created when missing; a last line left
    without its newline (an interrupted write) is terminated first, so the
    new record starts on its own line.

    Args:
      path: the JSONL results file.
      record: the run, a JSON-serializable dict with finite floats (``NaN``
        and ``inf`` raise ``ValueError``; store them as ``None``).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    needs_newline = False
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        if needs_newline:
            f.write("\n")
        f.write(json.dumps(record, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _lr_key(lr: float) -> str:
    return f"{float(lr):.10g}"


def _run_key(r: dict) -> tuple:
    return (
        r["name"],
        r.get("tag", ""),
        r["data"],
        int(r["size"]),
        int(r["seed"]),
        _lr_key(r["lr"]),
        int(r["steps"]),
        int(r["batch_size"]),
        r.get("schedule", "constant"),
    )


# --------------------------------------------------------------------------
# Results object.
# --------------------------------------------------------------------------
@dataclasses.dataclass
class SweepResult:
    """The runs of one sweep (one optimizer over sizes x LRs x seeds)."""

    name: str
    runs: list[dict]
    size_name: str = "size"
    path: str | None = None

    def summary(self, metric: str = "train_loss", grid_ratio: float | None = None) -> dict:
        """See :func:`summarize`."""
        return summarize(self.runs, metric=metric, grid_ratio=grid_ratio)

    def summaries(self, grid_ratio: float | None = None) -> dict:
        """``{'train': summary(train_loss), 'val': summary(val_loss)}``."""
        return {"train": self.summary("train_loss", grid_ratio), "val": self.summary("val_loss", grid_ratio)}

    def plot(self, path=None, *, ax=None, metric: str = "train_loss", title: str | None = None):
        """Loss vs LR, one curve per size, a star at each best LR (see
        :func:`~spectral_optax.lab.plot_sweep`)."""

        return plot_sweep(self, path, ax=ax, metric=metric, title=title)


# --------------------------------------------------------------------------
# The harness.
# --------------------------------------------------------------------------
def _call_factory(factory: Callable, lr, size):
    n = required_positional(factory, default=2)
    return factory(lr, size) if n is not None and n >= 2 else factory(lr)


def _num_chunks(steps: int, target: int) -> int:
    for c in range(min(target, steps), 0, -1):
        if steps % c == 0:
            return c
    return 1


def _run_mesh(devices) -> jax.sharding.Mesh | None:
    """A 1-D mesh ``('runs',)`` over ``devices``: ``None`` (no sharding), ``'all'`` (every device
    of every process), a count (the first ``n``), a list of devices, or a ``Mesh`` (all its devices)."""
    if devices is None:
        return None
    if isinstance(devices, jax.sharding.Mesh):
        devs = list(devices.devices.flat)
    elif devices == "all":
        devs = jax.devices()
    elif isinstance(devices, int):
        if not 1 <= devices <= jax.device_count():
            raise ValueError(f"devices={devices}: between 1 and jax.device_count() = {jax.device_count()}")
        devs = jax.devices()[:devices]
    else:
        devs = list(devices)
    return jax.sharding.Mesh(np.array(devs), ("runs",), axis_types=(jax.sharding.AxisType.Auto,))


def _on_runs(mesh, a: np.ndarray):
    """A host array placed with its first (run) axis split over ``mesh`` (every process calls this)."""
    if mesh is None:
        return jnp.asarray(a)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("runs"))
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


def _to_host(x) -> np.ndarray:
    """Every run's values on every process (sharded over hosts: an all-gather)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _make_programs(
    model,
    optimizer,
    size,
    data,
    batch_size,
    chunk_len,
    eval_idx,
    multiplier=None,
    mesh=None,
    update_args=None,
    step_metrics=None,
    after_schedule=None,
    final_metrics=None,
):
    train = tuple(jnp.asarray(a) for a in data.train)
    val = tuple(jnp.asarray(a) for a in data.val)
    eval_idx = jnp.asarray(eval_idx)
    with_aux = update_args is not None or step_metrics is not None
    if with_aux and getattr(model, "loss_with_aux", None) is None:
        raise ValueError(
            "update_args / step_metrics need a model whose loss_with_aux returns (loss, aux) "
            "(lab.Model.loss_with_aux; e.g. a Linen module with record_max_logits=True through lab.Model.from_linen)"
        )
    post = None if after_schedule is None else after_schedule(size)
    final = None if final_metrics is None else final_metrics(size)

    def make_opt(lr):
        opt = _call_factory(optimizer, lr, size)
        if not isinstance(opt, optax.GradientTransformation):
            raise TypeError(
                f"the optimizer factory must return an optax.GradientTransformation, got {type(opt).__name__}"
            )
        if multiplier is not None:
            opt = optax.chain(opt, optax.scale_by_schedule(multiplier))
        return opt if post is None else optax.chain(opt, post)

    def init_run(lr, seed):
        k_init, k_data = jax.random.split(jax.random.key(seed))
        params = model.init(k_init)
        return params, make_opt(lr).init(params), k_data

    def chunk(lr, state, t0):
        opt = make_opt(lr)

        def step(carry, t):
            params, opt_state, k_data = carry
            idx = jax.random.randint(jax.random.fold_in(k_data, t), (batch_size,), 0, data.num_train)
            x, y = data.batch(train, idx)
            if with_aux:
                (loss, aux), grads = jax.value_and_grad(model.loss_with_aux, has_aux=True)(params, x, y)
                extra = {} if update_args is None else update_args(aux)
                metrics = {} if step_metrics is None else step_metrics(aux)
            else:
                loss, grads = jax.value_and_grad(model.loss)(params, x, y)
                extra, metrics = {}, {}
            updates, opt_state = opt.update(grads, opt_state, params, **extra)
            params = optax.apply_updates(params, updates)
            metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
            return (params, opt_state, k_data), (loss.astype(jnp.float32), metrics)

        return jax.lax.scan(step, state, t0 + jnp.arange(chunk_len))

    def evaluate(state):
        x, y = data.batch(val, eval_idx)
        return model.loss(state[0], x, y).astype(jnp.float32)

    def finish(state):
        return {k: jnp.asarray(v, jnp.float32) for k, v in final(state[0]).items()}

    # With a mesh, every output keeps its run axis split over the devices: each device trains R/N runs.
    runs = (
        {} if mesh is None else {"out_shardings": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("runs"))}
    )
    init_p = jax.jit(jax.vmap(init_run), **runs)
    chunk_p = jax.jit(jax.vmap(chunk, in_axes=(0, 0, None)), donate_argnums=(1,), **runs)
    eval_p = jax.jit(jax.vmap(evaluate), **runs)
    final_p = None if final is None else jax.jit(jax.vmap(finish), **runs)
    return init_p, chunk_p, eval_p, final_p


def sweep(
    family: Callable[[int], Any],
    optimizer: Callable,
    sizes: Sequence[int],
    lrs: Sequence[float],
    data,
    *,
    steps: int,
    batch_size: int,
    seeds: Sequence[int] = (0,),
    results: str | os.PathLike | None = None,
    name: str = "sweep",
    tag: str = "",
    size_name: str = "size",
    eval_examples: int = 2048,
    curve_points: int = 20,
    chunks: int = 10,
    progress: bool = True,
    schedule: str | Callable | None = None,
    val_curve: bool = False,
    devices: Any = None,
    update_args: Callable[[Any], dict] | None = None,
    step_metrics: Callable[[Any], dict] | None = None,
    after_schedule: Callable | None = None,
    final_metrics: Callable[[int], Callable[[Any], dict]] | None = None,
) -> SweepResult:
    """Train ``family(size)`` for every size x LR x seed; resumable.

    Args:
      family: ``size -> Model`` (a :class:`~spectral_optax.lab.Model`
        with ``init(key)``, ``loss(params, x, y)``); see
        :func:`~spectral_optax.lab.mlp_family`.
      optimizer: ``(lr, size) -> optax.GradientTransformation`` (or
        ``lr -> ...``). Called inside ``vmap`` with a *traced* scalar ``lr``,
        so it must use ``lr`` arithmetically (every optax optimizer and the
        package's named optimizers do); for muP-style optimizers build
        ``base`` from ``family(base_size).shapes()``.
      sizes: widths, depths, ...: each is passed to ``family`` and
        ``optimizer``.
      lrs: the LR grid (factor-2 steps by convention, see :func:`lr_grid`).
      data: a lab :class:`~spectral_optax.lab.Dataset`.
      steps: training steps per run.
      batch_size: examples per step (sampled with replacement, the same
        sequence for every LR of a seed).
      seeds: seeds (init and data order).
      results: JSONL file; runs already in it (same name, tag, data, size,
        seed, lr, steps, batch_size) are not rerun, new runs are appended.
      name: the optimizer / experiment name recorded with every run.
      tag: free-form string to separate otherwise identical configurations.
      size_name: what ``size`` means (for plots), e.g. ``'width'``.
      eval_examples: validation examples (an evenly spaced fixed subset).
      curve_points: points of the recorded (bucket-averaged) loss curve.
      chunks: compiled chunks per run (progress-bar granularity).
      progress: show a tqdm progress bar.
      schedule: ``None`` / ``'constant'``, ``'warmup_cosine'`` (see
        :func:`warmup_cosine`; ``lrs`` are then peak LRs) or a callable
        ``step -> multiplier`` (recorded by its ``__name__``). Part of the
        resume key.
      val_curve: also record the validation loss after every chunk
        (``val_curve``, ``val_curve_steps``).
      devices: split the vmapped run axis over devices (each trains about
        ``R / N`` of the ``R`` runs; results identical to one device):
        ``None`` (default: no sharding), ``'all'`` (every device of every
        process, e.g. after ``jax.distributed.initialize()`` on a pod), a
        count, a list of devices or a ``jax.sharding.Mesh``. The run list is
        padded to a multiple of ``N`` (padding runs are discarded); with
        several processes only process 0 writes ``results``.
      update_args: ``aux -> dict``: keyword arguments of every
        ``optimizer.update`` call, from what the model's
        ``loss_with_aux`` recorded in that step's forward pass (e.g.
        ``lambda logits: {'max_logits': logits}`` for
        :func:`~spectral_optax.qk_clip`).
      step_metrics: ``aux -> {name: scalar or array}``: recorded at every
        step of every run (``step_metrics`` of the run record: ``{name: [one
        value per step]}``, an array as nested lists, e.g. the max logit of
        every layer). Like ``update_args``, it needs ``loss_with_aux``.
      after_schedule: ``size -> optax.GradientTransformation``, chained after the schedule's multiplier: a transform
        that must see the step as applied, such as
        :func:`~spectral_optax.qk_clip`, which rescales the query and key
        weights *after* their update (a multiplier after it would undo it).
        Like ``update_args``, it is not part of the resume key: give runs that
        differ in it their own ``name`` or ``tag``.
      final_metrics: ``size -> (params -> {name: scalar or array})``:
        evaluated once on every run's trained parameters (``final_metrics``
        of the run record, arrays as nested lists), e.g. the max logit of a
        fixed batch's forward pass or a weight-only bound. Not part of the
        resume key either: a run read back from ``results`` keeps what it
        recorded.

    Returns:
      a :class:`SweepResult` with every run of this configuration (recorded
      earlier or now).
    """
    lrs = [float(lr) for lr in lrs]
    seeds = [int(s) for s in seeds]
    sizes = [int(s) for s in sizes]
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    results = os.fspath(results) if results is not None else None
    schedule_name, multiplier = _schedule_fn(schedule, int(steps))
    base = dict(
        name=name, tag=tag, data=data.name, steps=int(steps), batch_size=int(batch_size), schedule=schedule_name
    )
    existing = {}
    for r in load_runs(results):
        try:
            existing[_run_key(r)] = r
        except (KeyError, TypeError, ValueError):
            continue
    todo = {}
    for size in sizes:
        missing = [
            (lr, seed)
            for seed in seeds
            for lr in lrs
            if _run_key(dict(base, size=size, seed=seed, lr=lr)) not in existing
        ]
        if missing:
            todo[size] = missing
    step_options = dict(
        update_args=update_args, step_metrics=step_metrics, after_schedule=after_schedule, final_metrics=final_metrics
    )
    mesh = _run_mesh(devices)
    n_dev = 1 if mesh is None else mesh.devices.size
    writer = jax.process_index() == 0
    n_chunks = _num_chunks(steps, chunks)
    chunk_len = steps // n_chunks
    n_eval = min(eval_examples, data.num_val)
    eval_idx = np.linspace(0, data.num_val - 1, n_eval).round().astype(np.int32)
    tail = max(1, int(math.ceil(0.05 * steps)))

    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=sum(len(m) for m in todo.values()) * steps, desc=name, unit="step", unit_scale=True, leave=False
        )
    new_runs = []
    try:
        for size, missing in todo.items():
            if bar is not None:
                bar.set_postfix_str(f"{size_name}={size}, runs={len(missing)}")
            t_start = time.time()
            model = family(size)
            init_p, chunk_p, eval_p, final_p = _make_programs(
                model, optimizer, size, data, batch_size, chunk_len, eval_idx, multiplier, mesh, **step_options
            )
            padded = missing + [missing[-1]] * (-len(missing) % n_dev)  # a multiple of the devices
            run_lrs = _on_runs(mesh, np.asarray([m[0] for m in padded], np.float32))
            run_seeds = _on_runs(mesh, np.asarray([m[1] for m in padded], np.uint32))
            state = init_p(run_lrs, run_seeds)
            chunk_out: list[np.ndarray] = []
            metric_out: list[dict] = []
            val_points: list[np.ndarray] = []
            t_steady = t_start
            for c in range(n_chunks):
                state, (chunk_losses, chunk_metrics) = chunk_p(run_lrs, state, jnp.int32(c * chunk_len))
                chunk_out.append(_to_host(chunk_losses))  # (R, chunk_len); syncs
                metric_out.append({k: _to_host(v) for k, v in chunk_metrics.items()})
                if val_curve and c < n_chunks - 1:
                    val_points.append(_to_host(eval_p(state)))
                if c == 0:  # the first chunk includes compilation
                    t_steady = time.time()
                if bar is not None:
                    bar.update(len(missing) * chunk_len)
            losses = np.concatenate(chunk_out, axis=1)
            val_losses = _to_host(eval_p(state))
            finals = {} if final_p is None else {k: _to_host(v) for k, v in final_p(state).items()}
            elapsed = time.time() - t_start
            # Wall-clock seconds per training step of one run (its share of the
            # vmapped program, compilation excluded; from the first chunk if only one).
            steady_steps = (n_chunks - 1) * chunk_len
            step_s = (time.time() - t_steady) / steady_steps if steady_steps else elapsed / steps
            step_s /= len(missing)
            val_points.append(val_losses)
            buckets = np.array_split(np.arange(steps), min(curve_points, steps))
            for j, (lr, seed) in enumerate(missing):
                curve = losses[j]
                train_loss = float(np.mean(curve[-tail:]))
                val_loss = float(val_losses[j])
                diverged = not (np.isfinite(train_loss) and np.isfinite(val_loss))
                rec = dict(
                    base,
                    size=size,
                    seed=seed,
                    lr=lr,
                    train_loss=_json_float(train_loss),
                    val_loss=_json_float(val_loss),
                    diverged=diverged,
                    initial_loss=_json_float(curve[0]),
                    curve_steps=[int(b[-1]) + 1 for b in buckets],
                    curve=[_json_float(np.mean(curve[b])) for b in buckets],
                    seconds=round(elapsed / len(missing), 3),
                    step_seconds=float(f"{step_s:.4g}"),
                )
                if metric_out and metric_out[0]:
                    rec["step_metrics"] = {
                        k: [_json_array(v) for v in np.concatenate([m[k][j] for m in metric_out])]
                        for k in metric_out[0]
                    }
                if finals:
                    rec["final_metrics"] = {k: _json_array(v[j]) for k, v in finals.items()}
                if val_curve:
                    rec["val_curve_steps"] = [(c + 1) * chunk_len for c in range(n_chunks)]
                    rec["val_curve"] = [_json_float(v[j]) for v in val_points]
                if results is not None and writer:
                    append_run(results, rec)
                new_runs.append(rec)
    finally:
        if bar is not None:
            bar.close()
    wanted = {_run_key(dict(base, size=size, seed=seed, lr=lr)) for size in sizes for seed in seeds for lr in lrs}
    runs = [r for k, r in existing.items() if k in wanted] + new_runs
    runs.sort(key=lambda r: (r["size"], r["seed"], r["lr"]))
    return SweepResult(name, runs, size_name=size_name, path=results)
