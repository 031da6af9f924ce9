"""Render the docs' tables of defaults from the code, in place: ``python tools/render_defaults.py``.

docs/guide.md ("Coefficients") holds, between ``<!-- auto_schedule table: generated -->`` and
``<!-- end auto_schedule table -->``, what ``auto_schedule(m, n, compute_dtype)`` returns for float32,
bfloat16 and float16 at aspects 1 and 4. This script rewrites that block from the code, then the
tables of ``tools/docs_tables.py`` (the same choices resolved into steps, start and iteration per
shape), so one command brings every generated table of defaults up to date.
``tests/test_docs_defaults.py`` fails when the guide's copy differs from what the code renders.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
BEGIN = "<!-- auto_schedule table: generated -->"
END = "<!-- end auto_schedule table -->"

#: ``(m, n)`` of each column: aspect ``n / m`` 1 and 4 (GPT-2 small's ``768^2`` and ``768 x 3072``).
SHAPES = ((768, 768), (768, 3072))
DTYPES = ("float32", "bfloat16", "float16")

_BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)\n?" + re.escape(END), re.S)


def cell(choice: tuple) -> str:
    """One table cell: ``auto_schedule``'s ``(coefficients, method, restarts)`` as Python writes it."""
    return f"`{choice!r}`"


def render() -> str:
    """The table, from ``spectral_optax._duals.polar.auto_schedule``."""
    import jax.numpy as jnp

    from spectral_optax._duals.polar import auto_schedule

    rows = [
        "| compute dtype | " + " | ".join(f"`{m} x {n}` (aspect {n // m})" for m, n in SHAPES) + " |",
        "|---" * (1 + len(SHAPES)) + "|",
    ]
    for name in DTYPES:
        dtype = getattr(jnp, name)
        rows.append(f"| {name} | " + " | ".join(cell(auto_schedule(m, n, dtype)) for m, n in SHAPES) + " |")
    return "\n".join(rows)


def current(text: str | None = None) -> str | None:
    """The table between the markers in docs/guide.md (``None`` without the markers)."""
    match = _BLOCK.search(GUIDE.read_text() if text is None else text)
    return match.group(1) if match else None


def write() -> None:
    """Rewrite the block in docs/guide.md, then ``tools/docs_tables.py``'s tables."""
    text = GUIDE.read_text()
    if current(text) is None:
        sys.exit(f"{GUIDE}: no '{BEGIN}' ... '{END}' block")
    GUIDE.write_text(_BLOCK.sub(lambda _: f"{BEGIN}\n{render()}\n{END}", text, count=1))
    print(f"wrote the auto_schedule table into {GUIDE.relative_to(ROOT)}")
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "tools" / "docs_tables.py")
    docs_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_tables)
    docs_tables.write()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write()
