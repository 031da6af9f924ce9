"""Every repository file and every Python name the docs and docstrings cite exists.

Scanned: README.md, docs/*.md (not docs/lab_log.md, the dated history, which cites files and names as they
were then), and the text of every module of spectral_optax and tools/ (docstrings and comments). Cited files:
paths under the repository's top-level folders (``docs/guide.md``, ``tests/test_x.py``, ``tools/x.py``, a
figure); cited names: dotted names under ``spectral_optax`` / ``so`` (and the guide's ``si.`` for
``so.initializers``, ``st.`` for ``so.transfer``), resolved attribute by attribute (importing private modules
on the way).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import spectral_optax

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "lab_log.md")]
CODE = sorted((ROOT / "spectral_optax").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
FOLDERS = ("docs", "tests", "tools", "benchmarks", "spectral_optax", "notebooks", ".ci")
_TOP = "|".join(re.escape(f) for f in FOLDERS)
FILE = re.compile(rf"(?<![\w/.-])((?:{_TOP})/[\w./-]*\w\.(?:py|md|txt|sh|png|svg|jsonl|json|npz|ipynb|toml|cfg))(?!\w)")
NAME = re.compile(r"(?<![\w.])(spectral_optax|so|si|st)((?:\.[A-Za-z_]\w*)+)")
ALIASES = {"so": "spectral_optax", "si": "spectral_optax.initializers", "st": "spectral_optax.transfer"}


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            return False
    return True


def _cited(path: Path):
    text = path.read_text()
    files = set(FILE.findall(text))
    names = set()
    for head, tail in NAME.findall(text):
        if head in ("si", "st") and path.name != "guide.md":
            continue  # the guide's abbreviations
        if "__mutmut_" in tail:
            continue  # a mutant's id (docs/reliability.md), not a name of the package
        names.add(ALIASES.get(head, head) + tail)
    return files, names


@pytest.mark.parametrize("path", DOCS + CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_file_and_name_exists(path):
    files, names = _cited(path)
    missing_files = sorted(f for f in files if not (ROOT / f).exists() and not (path.parent / f).exists())
    missing_names = sorted(n for n in names if not _resolve(n))
    assert not missing_files and not missing_names, (
        f"{path.relative_to(ROOT)} cites what does not exist: files {missing_files}, names {missing_names}"
    )


def test_the_check_catches_a_missing_file_and_name(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("see tools/render_defaults.py and `so.expert.no_such_name`, `so.muon` and docs/guide.md")
    files, names = _cited(doc)
    assert files == {"tools/render_defaults.py", "docs/guide.md"}
    assert not (ROOT / "tools/render_defaults.py").exists()
    assert [n for n in names if not _resolve(n)] == ["spectral_optax.expert.no_such_name"]
    assert spectral_optax.muon


# ------------------------------------------------------------------ signatures the docs' tables state
SIGNATURE = re.compile(r"`([A-Za-z_][\w.]*)\(([^`]*)\)`")
KWARG = re.compile(r"(?<![\w.])([a-z_]\w*)=('[^']*'|-?[\d.]+(?:e-?\d+)?|None|True|False|inf)")


def _table_signatures(path: Path):
    """``(name, keyword, value as written)`` from the first cell of every table row of ``path``."""
    for line in path.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        for name, args in SIGNATURE.findall(line.split(" | ")[0]):
            for kw, value in KWARG.findall(args):
                yield name, kw, value


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "docs" / "guide.md"], ids=lambda p: p.name)
def test_defaults_in_the_docs_tables_are_the_codes(path):
    """A table cell ``fn(..., kw=value)`` states ``fn``'s default for ``kw`` (the first of ``'a'|'b'`` choices)."""
    import inspect

    wrong, seen = [], 0
    for name, kw, value in _table_signatures(path):
        obj = spectral_optax
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None or not callable(obj):
            continue
        params = inspect.signature(obj).parameters
        if kw not in params:
            wrong.append(f"{name}: no argument {kw!r}")
            continue
        seen += 1
        default = params[kw].default
        stated = float("inf") if value == "inf" else eval(value)  # a literal matched by KWARG
        if stated != default:
            wrong.append(f"{name}({kw}={value}): the code's default is {default!r}")
    assert seen, f"{path.name}: no signature found in its tables"
    assert not wrong, f"{path.name}: " + "; ".join(wrong)


def test_readme_at_most_250_lines():
    """The README is the front page: details belong to the guide and the results page."""
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines (at most 250): move detail to docs/guide.md or docs/benchmarks.md"
