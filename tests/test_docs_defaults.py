"""The guide's auto_schedule table states what the code chooses (``python tools/docs_tables.py`` renders it)."""

import importlib.util
from pathlib import Path

import jax.numpy as jnp
import pytest

import spectral_optax as so

_SPEC = importlib.util.spec_from_file_location(
    "docs_tables", Path(__file__).resolve().parents[1] / "tools" / "docs_tables.py"
)
docs_tables = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docs_tables)

_NAME = "auto_schedule_choices"
_FIX = f"run `python tools/docs_tables.py {_NAME}` to regenerate it"


def _docs_table() -> str:
    text = docs_tables.current(_NAME)
    table = docs_tables.TABLES[_NAME]
    assert text is not None, f"docs/guide.md has no '{table.begin}' ... '{table.end}' block"
    return text


def test_guide_table_is_what_the_code_renders():
    assert _docs_table() == docs_tables.TABLES[_NAME].render(), (
        f"docs/guide.md's auto_schedule table differs from the code: {_FIX}"
    )


def test_check_mode_passes_on_the_docs():
    assert docs_tables.check() == 0, (
        "a generated table in the docs differs from the code: run `python tools/docs_tables.py`"
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_guide_table_states_auto_schedule_at_aspects_1_and_4(dtype):
    # Read the row back from the guide and compare it with the function itself, not with the renderer.
    rows = {line.split("|")[1].strip(): line for line in _docs_table().splitlines()[2:]}
    assert dtype in rows, f"docs/guide.md's auto_schedule table has no {dtype} row: {_FIX}"
    cells = [c.strip() for c in rows[dtype].strip().strip("|").split("|")[1:]]
    want = [f"`{so.expert.auto_schedule(m, m * aspect, getattr(jnp, dtype))!r}`" for m, aspect in ((768, 1), (768, 4))]
    assert cells == want, f"docs/guide.md states {cells} for {dtype}, auto_schedule chooses {want}: {_FIX}"


def test_the_gram_space_threshold_the_docs_state_is_the_codes():
    """'aspect >= 2.41 at 5 steps' (guide, math.md, auto_schedule's docstring) is where newton_schulz_method
    starts to pick the Gram-space iteration in float32, and math.md's formula gives it."""
    import inspect

    newton_schulz_method = so.expert.newton_schulz_method

    m = 1000
    n = next(n for n in range(m, 4 * m) if newton_schulz_method(m, n, 5, jnp.float32) == "gram")
    assert round(n / m, 2) == 2.41
    k = 5
    assert round((6.5 * k - 6) / (3 * k - 4), 2) == 2.41
    root = Path(__file__).resolve().parents[1]
    fn = so.expert.auto_schedule

    for name, text in (
        ("docs/guide.md", (root / "docs" / "guide.md").read_text()),
        ("docs/math.md", (root / "docs" / "math.md").read_text()),
        ("auto_schedule", inspect.getdoc(fn)),
    ):
        assert "aspect >= 2.41 at 5 steps" in " ".join(text.split()), f"{name} does not state the threshold 2.41"
        assert "2.5 at 5 steps" not in text and "l / s >= 2.5" not in text, name


def _guide_paragraph(start: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    i = text.index(start)
    return " ".join(text[i : text.find("\n\n", i)].split())


@pytest.mark.parametrize(
    ("paragraph", "function", "stated"),
    [
        ("**Defaults and why.** `p = 2`", "moga", {"p": 2.0, "base_factor": 25.0, "momentum": 0.95, "weight_decay": 0.0}),
        ("* **Named coefficients.**", "expert.polar_express_coefficients",
         {"l": 1e-3, "cushion": 0.02407327424182761, "safety": 1.01}),
        ("- **Gain.** The default is", "initializers.spectral_normal", {"gain": 1.0}),
        ("- **Gain.** The default is", "initializers.spectral_orthogonal", {"gain": 1.0}),
    ],
)  # fmt: skip
def test_defaults_the_guide_names_in_prose_are_the_codes(paragraph, function, stated):
    """The guide's prose states these defaults (``name = value`` or ``name=value``); they are the code's."""
    import inspect
    import re

    import spectral_optax as so

    text = _guide_paragraph(paragraph)
    fn = so
    for part in function.split("."):
        fn = getattr(fn, part)
    params = inspect.signature(fn).parameters
    for name, value in stated.items():
        match = re.search(rf"`{name} ?= ?([-\w.]+)`", text)
        assert match, f"docs/guide.md no longer states {function}'s {name} in the paragraph {paragraph!r}"
        assert float(match.group(1)) == value == params[name].default, (function, name, match.group(1))
