"""The docs' tables of defaults are the code's (tools/docs_tables.py renders them)."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("docs_tables", Path(__file__).resolve().parents[1] / "tools" / "docs_tables.py")
docs_tables = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docs_tables)


@pytest.mark.parametrize("name", sorted(docs_tables.TABLES))
def test_generated_table_matches_the_code(name):
    table = docs_tables.TABLES[name]
    assert docs_tables.current(name) == table.render(), (
        f"{table.path.name}'s '{name}' table differs from the code: run `python tools/docs_tables.py {name}`"
    )


def test_auto_schedule_table_states_the_bfloat16_default():
    # independent of the renderer: the rows a GPU / TPU user gets, written out by hand
    text = docs_tables.current("auto_schedule")
    assert "| bfloat16 | 768 x 768 (1) | `'power4'` | 4 | `'power'` | standard | - |" in text
    assert "| bfloat16 | 768 x 3072 (4) | `'power4'` | 4 | `'power'` | gram | 1 |" in text
    assert "| float32 | 768 x 768 (1) | `'quintic'` | 5 | `'frobenius'` | standard | - |" in text
