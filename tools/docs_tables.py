"""Tables in the docs that state a default, rendered from the code.

Each table sits in a document between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->``; ``python tools/docs_tables.py`` rewrites
every one of them from the code, and ``tests/test_docs_tables.py`` fails when
a document's copy differs from what the code renders (so a changed default
cannot leave the prose behind).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def auto_schedule_table() -> str:
    """What ``ns_coefficients='auto'`` runs, per compute dtype and matrix shape (``auto_schedule``)."""
    import jax.numpy as jnp

    from spectral_optax._duals.polar import (
        AUTO_GRAM_ASPECT,
        auto_schedule,
        default_preconditioning,
        gram_restarts,
        newton_schulz_method,
        resolve_coefficients,
    )

    shapes = sorted({(768, 768), (768, 1152), (768, int(768 * AUTO_GRAM_ASPECT)), (768, 1920), (768, 3072)})
    rows = [
        "| compute dtype | matrix `m x n` (aspect) | coefficients | steps | start | iteration | Gram-space restarts |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        for m, n in shapes:
            coef, method, restarts = auto_schedule(m, n, dtype)
            steps = len(resolve_coefficients(coef, None, dtype)[0])
            run = newton_schulz_method(m, n, steps, dtype, method)
            if run == "gram":
                restarts = tuple(restarts) if restarts is not None else gram_restarts(steps, dtype)
                rs = ", ".join(map(str, restarts)) or "none"
            else:
                rs = "-"
            rows.append(
                f"| {jnp.dtype(dtype).name} | {m} x {n} ({n / m:g}) | `'{coef}'` | {steps} | "
                f"`'{default_preconditioning(coef)}'` | {run} | {rs} |"
            )
    return "\n".join(rows)


TABLES = {"auto_schedule": (ROOT / "docs" / "guide.md", auto_schedule_table)}


def block(name: str, text: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN generated: {name} -->\n)(.*?)(\n<!-- END generated: {name} -->)", re.S)


def current(name: str) -> str | None:
    path, _ = TABLES[name]
    match = block(name, "").search(path.read_text())
    return match.group(2) if match else None


def write() -> None:
    for name, (path, render) in TABLES.items():
        text = path.read_text()
        pattern = block(name, text)
        if not pattern.search(text):
            sys.exit(f"{path}: no '<!-- BEGIN generated: {name} -->' block")
        path.write_text(pattern.sub(lambda m: m.group(1) + render() + m.group(3), text))
        print(f"wrote {name} into {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write()
