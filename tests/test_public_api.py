"""The public surface: pinned, small, and exactly what the API site documents.

A name added to or removed from ``spectral_optax.__all__`` (or the expert
submodule's) fails here until the pinned list below is changed on purpose;
the API pages (written by ``docs/_ext/apicheck.py`` at build time) are
checked to document exactly those names, and the docs' table of contents to
list every page.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import optax
import pytest

import spectral_optax as so

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import apicheck  # noqa: E402

TOP_LEVEL = {
    "optimizers": ["muon", "contrib_muon", "normuon", "moga", "rescaled_adamw", "spectral_sgd", "mup_sgd", "mup_adamw"],
    "transforms": [
        "scale_by_spectral_norm",
        "scale_by_row_norm",
        "scale_by_column_norm",
        "scale_by_sign",
        "scale_by_fan_out_rms",
        "orthogonalize_via_newton_schulz",
        "scale_by_parametrization1",
        "route_lr_scale",
        "scale_by_neuron_second_moment",
        "scale_by_spectral_trust_ratio",
        "ema_momentum",
        "decoupled_weight_decay",
        "qk_clip",
        "newton_schulz",
    ],
    "qk_clip inputs": ["AttentionSpec", "attention_max_logits", "collect_max_logits"],
    "depth": ["depth_residual_scale", "depth_lr_scale", "depth_scaled_init", "residual_alpha"],
    "geometry": [
        "Geometry",
        "GeometryMap",
        "GeometryError",
        "GeometryWarning",
        "as_geometry_map",
        "describe",
        "init_with_geometry",
    ],
    "submodules": ["initializers", "diagnostics", "expert", "lab", "nn", "transfer"],
}
PINNED = [name for group in TOP_LEVEL.values() for name in group]

#: Names defined in ``spectral_optax/__init__.py`` that are not API (imports the module itself uses).
_NOT_API = {"annotations", "importlib", "Any"}


def test_top_level_is_pinned_and_small():
    assert len(so.__all__) == len(set(so.__all__)), "duplicate names in __all__"
    assert sorted(so.__all__) == sorted(PINNED)
    assert len(so.__all__) <= 45


def test_every_public_attribute_is_in_all():
    for sub in ("diagnostics", "expert", "lab", "nn", "transfer"):
        getattr(so, sub)  # load the lazy submodules
    public = {n for n in vars(so) if not n.startswith("_")} - _NOT_API
    assert public == set(so.__all__)


def test_expert_names_are_not_also_top_level():
    assert not set(so.expert.__all__) & set(so.__all__)
    assert len(so.expert.__all__) == len(set(so.expert.__all__))
    for name in so.expert.__all__:
        assert getattr(so.expert, name) is not None


@pytest.mark.parametrize("module_name,title,intro", apicheck.MODULES, ids=[m[0] for m in apicheck.MODULES])
def test_api_page_documents_exactly_all(module_name, title, intro):
    module = importlib.import_module(module_name)
    text = apicheck.page_text(module_name, title, intro)
    documented = re.findall(r"^\.\. auto(?:class|function|data):: (\w+)$", text, flags=re.M)
    expected = [n for n in module.__all__ if not inspect.ismodule(getattr(module, n))]
    assert documented == expected


def test_every_public_submodule_has_a_page_in_the_toc():
    pages = {m[0] for m in apicheck.MODULES}
    for name in so.__all__:
        if inspect.ismodule(getattr(so, name)):
            assert f"spectral_optax.{name}" in pages, f"spectral_optax.{name} has no API page"
    toc = (ROOT / "docs" / "index.md").read_text()
    for page in pages:
        assert re.search(rf"^api/{re.escape(page)}$", toc, flags=re.M), f"api/{page} is not in docs/index.md's toctree"


def test_one_return_type():
    """Every public factory of an optax transform is annotated and returns ``GradientTransformationExtraArgs``."""
    for name in TOP_LEVEL["optimizers"] + TOP_LEVEL["transforms"] + ["depth_residual_scale", "depth_lr_scale"]:
        fn = getattr(so, name)
        if name == "newton_schulz":
            continue  # a pure function on arrays
        assert inspect.signature(fn).return_annotation in (
            "optax.GradientTransformationExtraArgs",
            optax.GradientTransformationExtraArgs,
        ), name
        tx = fn(**_required_kwargs(name))
        assert isinstance(tx, optax.GradientTransformationExtraArgs), name


def _required_kwargs(name: str) -> dict:
    """The smallest arguments that build each factory (learning rates and the required depth counts)."""
    sig = inspect.signature(getattr(so, name))
    out = {}
    for p in sig.parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in ("learning_rate",):
            out[p.name] = 0.1
        elif p.name in ("num_blocks",):
            out[p.name] = 4
        elif p.name in ("exponent", "threshold", "tau", "weight_decay"):
            out[p.name] = 1.0
        else:
            raise AssertionError(f"{name}: no test value for required argument {p.name!r}")
    return out
