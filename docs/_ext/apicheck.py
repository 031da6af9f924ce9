"""Sphinx extension: the API pages from each public module's ``__all__``, and every public argument documented.

* ``builder-inited``: writes ``api/<module>.rst`` with one autodoc entry per name in the module's ``__all__``
  (so a new public name is rendered without editing the docs, and a removed one disappears);
* for every public function (and class constructor), the ``Args:`` section of its docstring must name each
  parameter of its signature, and nothing else: a renamed or undocumented argument is a warning, and the CI build
  (``sphinx-build -W``) fails on it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

#: (module, page title, intro) in the order of the reference's table of contents.
MODULES = (
    ("spectral_optax", "spectral_optax", "Optimizers, transforms, geometry, dual maps and depth scaling."),
    ("spectral_optax.initializers", "spectral_optax.initializers", "Parametrization-1 initializers (Linen and NNX)."),
    ("spectral_optax.diagnostics", "spectral_optax.diagnostics", "Feature-learning diagnostics."),
    ("spectral_optax.nn", "spectral_optax.nn", "Flax blocks with depth scaling."),
    ("spectral_optax.nn.linen", "spectral_optax.nn.linen", "Linen models."),
    ("spectral_optax.nn.nnx", "spectral_optax.nn.nnx", "NNX models."),
    ("spectral_optax.lab", "spectral_optax.lab", "The transfer lab: sweeps, data, plots."),
    ("spectral_optax.transfer", "spectral_optax.transfer", "Transfer rules for horizon, batch size, weight decay."),
    ("spectral_optax.expert", "spectral_optax.expert",
     "For experts: coefficient tables, schedules, plans, states, routes."),
)

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Attributes|Returns|Yields|Raises|Example|Examples|Note|"
                      r"Notes|References|Warning|Warnings|See Also)\s*:\s*$")
_ARG = re.compile(r"^(\*{0,2}[A-Za-z_][\w]*(?:\s*,\s*\*{0,2}[A-Za-z_][\w]*)*)\s*(?:\([^)]*\))?\s*:(?:\s|$)")


def documented_args(doc: str) -> list[str] | None:
    """Names listed in a Google-style ``Args:`` section (``a, b: ...`` documents both); None if there is none."""
    lines = doc.splitlines()
    names: list[str] | None = None
    inside, indent = False, None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            inside = m.group(2) in ("Args", "Arguments", "Parameters")
            if inside:
                names = names or []
            indent = None
            continue
        if not inside or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width < indent:
            inside = False
            continue
        if width == indent:
            a = _ARG.match(line.strip())
            if a:
                names.extend(n.strip().lstrip("*") for n in a.group(1).split(","))
    return names


def signature_args(obj) -> list[str]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [n for n, p in sig.parameters.items() if n not in ("self", "cls")]


def problems(name: str, obj) -> list[str]:
    """What is wrong with ``obj``'s argument documentation (empty when right)."""
    if not (inspect.isfunction(obj) or (inspect.isclass(obj) and "__init__" in vars(obj))):
        return []
    if inspect.isclass(obj) and (issubclass(obj, (tuple, BaseException)) or hasattr(obj, "__dataclass_fields__")):
        return []  # NamedTuple states, errors and dataclasses: fields, documented as attributes
    args = signature_args(obj)
    doc = inspect.getdoc(obj) or ""
    listed = documented_args(doc)
    if listed is None:
        return [f"{name}: no 'Args:' section for {args}"] if args else []
    out = [f"{name}: argument '{a}' is not documented in 'Args:'" for a in args if a not in listed]
    out += [f"{name}: 'Args:' documents '{a}', which is not an argument" for a in listed if a not in args]
    return out


def all_problems() -> list[str]:
    out = []
    for module_name, _, _ in MODULES:
        module = importlib.import_module(module_name)
        for public in getattr(module, "__all__", ()):
            obj = getattr(module, public)
            if getattr(obj, "__module__", "").startswith("spectral_optax") or module_name == "spectral_optax":
                out += problems(f"{module_name}.{public}", obj)
    return sorted(set(out))


def documented_names(module_name: str) -> list[str]:
    """The names the API page of ``module_name`` documents: its ``__all__`` without submodules."""
    module = importlib.import_module(module_name)
    return [n for n in getattr(module, "__all__", ()) if not inspect.ismodule(getattr(module, n))]


def page_text(module_name: str, title: str, intro: str) -> str:
    """The reStructuredText of one API page: one autodoc entry per documented name."""
    module = importlib.import_module(module_name)
    lines = [title, "=" * len(title), "", intro, "", f".. currentmodule:: {module_name}", ""]
    for public in documented_names(module_name):
        obj = getattr(module, public)
        kind = "autoclass" if inspect.isclass(obj) else ("autofunction" if callable(obj) else "autodata")
        lines += [f".. {kind}:: {public}"] + (["   :members:"] if kind == "autoclass" else []) + [""]
    return "\n".join(lines) + "\n"


def _write_pages(app) -> None:
    api = Path(app.srcdir) / "api"
    api.mkdir(exist_ok=True)
    for module_name, title, intro in MODULES:
        (api / f"{module_name}.rst").write_text(page_text(module_name, title, intro))
    from sphinx.util import logging  # noqa: PLC0415  (the page and argument checks run without Sphinx, in the tests)

    logger = logging.getLogger(__name__)
    for message in all_problems():
        logger.warning(message, type="apicheck")


def setup(app):
    app.connect("builder-inited", _write_pages)
    return {"parallel_read_safe": True}


if __name__ == "__main__":
    found = all_problems()
    print("\n".join(found) or "every public argument documented")
    print(len(found), "problems")
