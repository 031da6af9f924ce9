"""Shared command-line plumbing for the lab benchmarks (public API only)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small preset (< 3 minutes on 2 CPU cores)")
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--out", default="out", help="directory for figures and results files")
    return p


def to_jsonable(x):
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
    if path is None:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(to_jsonable(payload), f, indent=1)
    print(f"wrote {path}")


def environment() -> dict:
    import jax

    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "python": platform.python_version(),
    }


def loglog_slope(xs, ys) -> float:
    """Least-squares slope of log(y) vs log(x) (nan if any y <= 0 or non-finite)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(xs) < 2 or not np.all(np.isfinite(ys)) or np.any(ys <= 0):
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])
