"""Sphinx configuration of the API reference site (build: see README, "Documentation").

The pages are the Markdown files of this folder (via MyST) and an API reference generated from each public module's
``__all__`` by ``_ext/apicheck.py``, which also fails the build (``-W``) on an undocumented or renamed argument.
Cross-references (``:func:`~spectral_optax.muon```, Markdown links between pages) are checked (``nitpicky``).
"""

import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here / "_ext"))
sys.path.insert(0, str(here.parent))

project = "spectral_optax"
author = "spectral_optax developers"
copyright = "2026, spectral_optax developers"  # noqa: A001

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.intersphinx",
    "myst_parser",
    "apicheck",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures/*.md"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: no second description beside :members:

nitpicky = True
# Types from the libraries the API is written against; their own docs are not fetched (no network at build time).
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jnp|optax|flax|nnx|nn|np|numpy|chex|collections|typing|os|pathlib)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|PyTree|ArrayLike|Array|Shape|DTypeLike)"),
    (r"py:.*", r"(optional|callable|array|arrays|tree|pytree|float|int|str|bool|None|tuple|list|dict|module)"),
    (r"py:.*", r".*\b(GeometryLike|Override|Coefficients|ScalarOrSchedule|AxisName|Triple|Initializer)\b.*"),
    (r"py:class", r"_\w+"),  # private helper types in signatures (not part of the API)
]


html_theme = "furo"
html_title = "spectral_optax"
