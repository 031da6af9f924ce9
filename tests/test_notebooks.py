"""Every notebook under notebooks/ executes top to bottom without errors."""

import pathlib

import pytest

nbclient = pytest.importorskip("nbclient", reason="install the 'test' extra (nbclient, ipykernel)")
import nbformat  # noqa: E402  (a dependency of nbclient)

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "spectral_sgd" in outputs
