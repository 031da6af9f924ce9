"""What every benchmark command shares: its argument parser, JSON writer, environment record and timer.

The benchmarks under ``benchmarks/`` are thin presets over :mod:`spectral_optax.lab`; this module is their one
command-line, JSON and environment helper (a benchmark never writes JSON or records its machine on its own)::

    from spectral_optax.lab import cli

    p = cli.parser("my sweep")              # --quick, --json PATH, --out DIR
    cli.add_dtype_argument(p)               # --dtype float32|bfloat16
    args = p.parse_args()
    model_dtype, ns_dtype, numerics = cli.lab_numerics(args.dtype)
    ...
    cli.write_json(args.json, {"summary": ..., "environment": cli.environment()})
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time

import numpy as np


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark takes: ``--quick``, ``--json PATH``, ``--out DIR``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small preset (< 3 minutes on 2 CPU cores)")
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--out", default="out", help="directory for figures and results files")
    return p


#: Printed by every quick preset that is a smoke run of the machinery (``.format(benchmark=..., preset=...)``).
SMOKE_NOTE = (
    "--quick is a smoke run of the machinery (few depths / widths, few steps, one seed by default): "
    "its spreads do not measure transfer; the measurement is `python -m benchmarks.{benchmark} "
    "--preset {preset}` (docs/benchmarks.md)"
)


def preset_with_overrides(args, presets, keys) -> tuple[str, dict]:
    """``(preset name, its config)`` (``--quick``, else ``--preset``, else ``'cpu'``) with every ``keys``
    option the command line sets."""
    preset = "quick" if args.quick else (args.preset or "cpu")
    cfg = dict(presets[preset])
    for key in keys:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    return preset, cfg


def to_jsonable(x):
    """``x`` with NumPy scalars and arrays as Python numbers and lists, dict keys as strings, non-finite floats
    as ``None`` (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    return x


def write_json(path, payload: dict) -> None:
    """Write ``payload`` (through :func:`to_jsonable`) to ``path``, making its directory; nothing when ``path``
    is ``None``."""
    if path is None:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(to_jsonable(payload), f, indent=1)
    print(f"wrote {path}")


def finish(path, payload: dict, t0: float) -> float:
    """Print the seconds since ``t0`` as ``(N s)`` and :func:`write_json` ``payload`` with ``seconds`` and
    ``environment`` (:func:`environment`) added last; returns the seconds."""
    elapsed = time.time() - t0
    print(f"\n({elapsed:.0f} s)")
    write_json(path, {**payload, "seconds": elapsed, "environment": environment()})
    return elapsed


def environment() -> dict:
    """The machine a result was measured on: UTC date, JAX version, backend, devices, Python version."""
    import jax

    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "python": platform.python_version(),
    }


def data_fingerprint(data) -> str:
    """The first 12 hex digits of the MD5 of a lab dataset's arrays (train, then validation): two machines
    whose fingerprints differ trained on different data (the bundled text ships with Python and changes
    between Python releases)."""
    import hashlib

    h = hashlib.md5()
    for a in (*data.train, *data.val):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:12]


def loglog_slope(xs, ys) -> float:
    """Least-squares slope of log(y) vs log(x) (nan if any y <= 0 or non-finite)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(xs) < 2 or not np.all(np.isfinite(ys)) or np.any(ys <= 0):
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def hidden_kernel_tree(d: int, blocks: int, seed: int | None = None, scale: float = 0.02):
    """The hidden kernels of a GPT-2-style stack (qkv d x 3d, proj d x d, fc d x 4d,
    fc2 4d x d per block): ``jax.ShapeDtypeStruct``s, or N(0, scale^2) arrays when
    ``seed`` is given."""
    import jax
    import jax.numpy as jnp

    shapes = {"qkv": (d, 3 * d), "proj": (d, d), "fc": (d, 4 * d), "fc2": (4 * d, d)}
    tree = {
        f"block_{i}": {name: {"kernel": jax.ShapeDtypeStruct(s, jnp.float32)} for name, s in shapes.items()}
        for i in range(blocks)
    }
    if seed is None:
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape, x.dtype) * scale for k, x in zip(keys, leaves)])


def time_update_steps(optimizers: dict, params, grads, reps: int, extra: dict | None = None):
    """Median jitted ``tx.update`` time per optimizer, interleaved in one process.

    Every step is compiled and run twice first (compile + warm-up); then, for
    ``reps`` rounds, each optimizer (and each zero-argument callable in
    ``extra``) is timed once per round, the order rotating every round so
    that slow drifts of a shared machine hit all of them alike.

    Returns:
      ``(median_s, all_s, compile_s)`` dicts keyed by name.
    """
    import jax

    fns, compile_s = {}, {}
    for name, tx in optimizers.items():
        state = tx.init(params)
        step = jax.jit(tx.update)
        t0 = time.perf_counter()
        jax.block_until_ready(step(grads, state, params))  # compile + first run
        compile_s[name] = time.perf_counter() - t0
        jax.block_until_ready(step(grads, state, params))  # warm-up
        fns[name] = lambda step=step, state=state: step(grads, state, params)
        print(f"  compiled {name} ({compile_s[name]:.1f} s)", flush=True)
    for name, fn in (extra or {}).items():
        jax.block_until_ready(fn())
        fns[name] = fn
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[n]())
            times[n].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{reps}: " + ", ".join(f"{n}={times[n][-1]:.3f}s" for n in names), flush=True)
    return {n: float(np.median(v)) for n, v in times.items()}, times, compile_s


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
    """``--dtype float32|bfloat16``: the lab benchmarks' numerics (see :func:`lab_numerics`)."""
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="numerics of the models and of Muon's iteration, the same on every backend",
    )


def on_accelerator() -> bool:
    """Whether JAX's default backend is a GPU or TPU (budgets are sized by backend)."""
    import jax

    return jax.default_backend() != "cpu"


def lab_numerics(dtype: str = "float32"):
    """The numerics of a lab benchmark, identical on every backend.

    ``'float32'``: float32 arithmetic everywhere: matmuls at
    ``Precision.HIGHEST`` (a GPU's default for float32 is TensorFloat-32, a
    TPU's a single bfloat16 pass) and a float32 Newton-Schulz iteration
    (GPUs/TPUs default to bfloat16), so a result does not depend on the
    backend it was measured on. ``'bfloat16'``: bfloat16 layers with float32
    parameters and a bfloat16 iteration, on every backend (the fast setting on
    accelerators; emulated, slowly, on a CPU).

    Returns:
      ``(model compute dtype or None, Newton-Schulz compute dtype, a function
      returning a fresh context manager to trace and run each sweep in)``.
    """
    import contextlib

    import jax
    import jax.numpy as jnp

    if dtype == "float32":
        return None, jnp.float32, lambda: jax.default_matmul_precision("highest")
    if dtype == "bfloat16":
        return jnp.bfloat16, jnp.bfloat16, contextlib.nullcontext
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")


#: The HLO ops :func:`collective_bytes` counts.
COLLECTIVES = (
    "all-gather",
    "all-gather-start",
    "all-reduce",
    "all-reduce-start",
    "all-to-all",
    "reduce-scatter",
    "collective-permute",
    "collective-permute-start",
    "collective-broadcast",
    "ragged-all-to-all",
)
_BYTES = {
    "f64": 8,
    "s64": 8,
    "u64": 8,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "s8": 1,
    "u8": 1,
    "pred": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
}
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRUE_FALSE = re.compile(r"(?:true|false)_computation=%?([\w.\-]+)")
_SHAPE = re.compile(r"\b([a-z]+[0-9]*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")


def _type_bytes(type_str: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(type_str):
        if dtype not in _BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dtype]
    return total


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of every collective op in an HLO module's text, by op name, per device.

    Each instruction ``%name = TYPE op(%a, %b, ...)`` defines ``name``'s type;
    a collective's bytes are the sizes of its operands' types (one device's
    share of the data it puts into the collective), except an all-gather's,
    which are its result's (what each device receives and holds: ``k`` times
    its operand over ``k`` devices; counted by the operand, a gather over many
    devices would look almost free). A device runs one branch of a
    ``conditional``, so the collectives in its branches count as the costliest
    branch's (by total bytes), as XLA's cost analysis counts its flops.
    """
    types: dict[str, str] = {}
    own: dict[str, dict[str, int]] = {}  # computation -> its collectives' bytes by op
    branches: list[list[str]] = []
    calls = []
    computation = ""
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            continue
        m = _DEF.match(line)
        if not m:
            continue
        name, type_str, op, rest = m.groups()
        types[name] = type_str
        if op == "conditional":
            listed = _BRANCHES.search(rest)
            names = listed.group(1).split(",") if listed else _TRUE_FALSE.findall(rest)
            branches.append([b.strip().lstrip("%") for b in names])
        if op in COLLECTIVES:
            depth, args = 0, ""
            for ch in rest:  # operands up to the matching ')'
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    if depth == 0:
                        break
                    depth -= 1
                args += ch
            operands = [a.strip().lstrip("%") for a in args.split(",") if a.strip()]
            calls.append((computation, op.removesuffix("-start"), operands, type_str, op.endswith("-start")))
    for computation, op, operands, result, is_start in calls:
        nbytes = 0
        for a in operands:
            a = a.split(" ")[-1].lstrip("%")  # "f32[..] %x" or "%x"
            nbytes += _type_bytes(types.get(a, ""))
        if op == "all-gather":  # the result (an async start's result is the tuple (operands, result))
            nbytes = _type_bytes(result) - (nbytes if is_start else 0)
        counts = own.setdefault(computation, {})
        counts[op] = counts.get(op, 0) + nbytes
    out: dict[str, int] = {}
    for counts in own.values():
        for op, nbytes in counts.items():
            out[op] = out.get(op, 0) + nbytes
    for names in branches:  # every branch was counted: keep the costliest one's
        taken = [own.get(b, {}) for b in names]
        if len(taken) < 2:
            continue
        costliest = max(taken, key=lambda c: sum(c.values()))
        for counts in taken:
            for op, nbytes in counts.items():
                out[op] -= nbytes
        for op, nbytes in costliest.items():
            out[op] += nbytes
    return out


def compiled_costs(jitted, *args) -> tuple[float, int]:
    """``(flops, collective bytes)`` of one device's compiled program for ``jitted(*args)``."""
    compiled = jitted.lower(*args).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops = float((cost or {}).get("flops", 0.0))
    return flops, int(sum(collective_bytes(compiled.as_text()).values()))
