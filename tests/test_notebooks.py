"""Every notebook under notebooks/ executes top to bottom (QUICK mode) without errors.

Each notebook stores ``QUICK = True``; in that mode it runs in well under a
minute on 2 CPU cores. The expected strings below are printed by the
notebook's last computations, so a notebook that silently skipped its work
fails here.
"""

import pathlib
import re

import pytest

nbclient = pytest.importorskip("nbclient", reason="install the 'test' extra (nbclient, ipykernel)")
import nbformat  # noqa: E402  (a dependency of nbclient)

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
EXPECT = {
    "01_quickstart.ipynb": ["spectral_sgd"],
    "02_spectral_condition.ipynb": ["feature change", "independent", "alignment", "||W||_* ="],
    "03_width_transfer.ipynb": ["max/min over widths", "spread"],
    "04_depth_transfer.ipynb": ["output RMS by depth", "best LR per depth"],
    "05_muon_vs_moga.ipynb": ["Muon", "MOGA p=2", "stable rank"],
}


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == sorted(EXPECT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_clean_and_quick(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "clear the outputs"
    if path.name != "01_quickstart.ipynb":
        assert re.search(r"^QUICK = True\b", code[0].source, re.MULTILINE), "the first code cell sets QUICK = True"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    for s in EXPECT[path.name]:
        assert s in outputs, (path.name, s)
