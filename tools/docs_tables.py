"""Tables in the docs that state a default, rendered from the code: one tool for all of them.

Each table sits in a document between two marker lines (``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->``, or the markers named in ``TABLES``). The tables:

* ``auto_schedule`` (docs/guide.md, "Coefficients"): what ``ns_coefficients='auto'`` runs per compute
  dtype and matrix shape (coefficients, steps, start, iteration, Gram-space restarts);
* ``auto_schedule_choices`` (docs/guide.md, "Coefficients"): what ``auto_schedule(m, n, compute_dtype)``
  returns for float32, bfloat16 and float16 at aspects 1 and 4;
* ``api`` (README.md, "API"): the signature table, every shown argument with the default the code has
  (``inspect.signature``); the descriptions are ``API_ROWS`` below.

Usage::

    python tools/docs_tables.py                 # rewrite every table in place
    python tools/docs_tables.py NAME [NAME ...]  # rewrite only these tables
    python tools/docs_tables.py --check [NAME]   # exit 1 (and name the table) where a copy differs

``tests/test_docs_tables.py`` and ``tests/test_docs_defaults.py`` fail when a document's copy differs
from what the code renders (so a changed default cannot leave the prose behind).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
README = ROOT / "README.md"

#: ``(m, n)`` of each column of ``auto_schedule_choices``: aspect ``n / m`` 1 and 4 (GPT-2 small's
#: ``768^2`` and ``768 x 3072``).
SHAPES = ((768, 768), (768, 3072))
DTYPES = ("float32", "bfloat16", "float16")


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


def cell(choice: tuple) -> str:
    """One table cell: ``auto_schedule``'s ``(coefficients, method, restarts)`` as Python writes it."""
    return f"`{choice!r}`"


def auto_schedule_choices_table() -> str:
    """``auto_schedule(m, n, dtype)`` as it returns it, per compute dtype at aspects 1 and 4."""
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


#: README's API table: ``(callables, the arguments shown, what it does)``; a callable is a dotted name under
#: ``spectral_optax``, shown with the named arguments and their defaults from the code (``...`` when it has
#: more), or a plain string shown as it is.
API_ROWS: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("muon",), ("momentum", "nesterov", "scale", "ns_coefficients", "ns_preconditioning", "output"),
     "EMA momentum, `scale * U V^T` per hidden matrix (Newton-Schulz / Polar Express); embeddings, vectors, "
     "head routed by geometry"),
    (("contrib_muon",), ("ns_coeffs", "ns_steps", "beta", "eps", "preconditioning", "muon_weight_dimension_numbers"),
     "`optax.contrib.muon`'s signature, routing, state and update, orthogonalized on this package's engine "
     "(dimension numbers -> geometry)"),
    (("normuon",), ("momentum", "beta2", "scale"),
     "Muon with a per-output-neuron second moment after the orthogonalization (NorMuon)"),
    (("moga",), ("p", "variant", "base_factor", "head_base_width", "momentum"),
     "EMA momentum, row (p,mean)->inf or column dual per matrix; `sign` for embeddings and vectors; "
     "`head_base_width=` the proxy's width: a read-out step that does not grow with width"),
    (("spectral_sgd",), ("momentum", "method"), "momentum, update rescaled to spectral norm `sqrt(d_out/d_in)`"),
    (("mup_sgd", "mup_adamw", "route_lr_scale"), ("base", "embedding"),
     "muP per-layer learning rates (`d_out/n_in` for SGD, `1/n_in` for Adam) relative to a base model; "
     "per-route multipliers after any optimizer"),
    (("rescaled_adamw",), ("p", "q"), "AdamW with Adam's step times `d_out^(1/q) / d_in^(1/p)` per matrix"),
    (("orthogonalize_via_newton_schulz", "scale_by_spectral_norm", "scale_by_row_norm", "scale_by_column_norm",
      "scale_by_sign", "scale_by_fan_out_rms", "scale_by_parametrization1", "ema_momentum", "decoupled_weight_decay"),
     (), "the pieces the optimizers are built from, each an Optax transform"),
    (("depth_residual_scale", "depth_scaled_init", "residual_alpha"), (),
     "inverse-depth residual scaling in absorbed form"),
    (("initializers.spectral_normal", "initializers.spectral_orthogonal", "initializers.spectral_embedding"), (),
     "Parametrization-1 Flax initializers (Linen and NNX)"),
    (("newton_schulz", "expert.row_normalize", "expert.column_normalize", "expert.polar_express_coefficients"), (),
     "the dual maps as pure functions on `(slices, d_in, d_out)` (`coefficients`, `steps`, `preconditioning` "
     "here; `ns_coefficients`, `ns_steps`, `ns_preconditioning` on the transforms and optimizers, which also "
     "take `optax.contrib.muon`'s `ns_coeffs` and `preconditioning`)"),
    (("Geometry", "GeometryMap", "init_with_geometry", "describe", "as_geometry_map"), (),
     "what every parameter is (`GeometryMap.from_apply / from_linen / from_nnx`: traced, hinted or named; "
     "`describe` says which); overrides by regex"),
    (("initializers.reinitialize", "expert.orthogonalization_plan"), (),
     "Parametrization 1 for a model you cannot edit (warns on a tied table); who orthogonalizes what on a mesh"),
    (("scale_by_spectral_trust_ratio", "initializers.spectral_normalized"), ("rule",),
     "LARS/LAMB trust ratios corrected for the spectral condition; any initializer rescaled to the target "
     "spectral norm"),
    (("diagnostics",), (), "`coord_check`, `relative_weight_change`, `spectral_norm`, `stable_rank`, `alignment`, "
     "`init_alignment`, `qk_logit_bound`: measure whether features move by Theta(1)"),
    (("lab", "nn"), (), "vmapped, resumable learning-rate sweeps (`sweep`, `lr_grid`, data); Flax blocks with "
     "`alpha` scaling (residual MLP, transformer)"),
)  # fmt: skip


def _signature(dotted: str, shown: tuple[str, ...]) -> str:
    """``name(lr, *, a=default, ...)`` with the code's defaults (``name`` for a module or a class)."""
    import inspect

    import spectral_optax

    obj = spectral_optax
    for part in dotted.split("."):
        obj = getattr(obj, part)
    if inspect.ismodule(obj) or inspect.isclass(obj) or not shown:
        return f"`{dotted}`"
    params = inspect.signature(obj).parameters
    parts, star = [], False
    required = [p for p in params.values() if p.default is inspect.Parameter.empty and p.kind != p.VAR_KEYWORD]
    parts += ["lr" if p.name == "learning_rate" else p.name for p in required]
    for name in shown:
        if name not in params:
            continue
        p = params[name]
        if p.kind == p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(f"{name}={p.default!r}")
    if len(required) + sum(n in params for n in shown) < len(params):
        parts.append("...")
    return f"`{dotted}({', '.join(parts)})`"


def api_table() -> str:
    """README's API table (signatures with the code's defaults)."""
    rows = ["| name | what it does ([math](docs/math.md)) |", "|---|---|"]
    for names, shown, what in API_ROWS:
        rows.append("| " + ", ".join(_signature(n, shown) for n in names) + f" | {what} |")
    return "\n".join(rows)


class Table(NamedTuple):
    path: Path
    render: Callable[[], str]
    begin: str
    end: str


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN generated: {name} -->", f"<!-- END generated: {name} -->"


TABLES = {
    "auto_schedule": Table(GUIDE, auto_schedule_table, *_markers("auto_schedule")),
    "api": Table(README, api_table, *_markers("api")),
    "auto_schedule_choices": Table(
        GUIDE,
        auto_schedule_choices_table,
        "<!-- auto_schedule table: generated -->",
        "<!-- end auto_schedule table -->",
    ),
}


def block(name: str) -> re.Pattern:
    """The table ``name`` between its markers: groups (begin line, table, end line)."""
    table = TABLES[name]
    return re.compile(rf"({re.escape(table.begin)}\n)(.*?)(\n{re.escape(table.end)})", re.S)


def current(name: str) -> str | None:
    """The document's copy of table ``name`` (``None`` without the markers)."""
    match = block(name).search(TABLES[name].path.read_text())
    return match.group(2) if match else None


def write(names=None) -> None:
    """Rewrite the tables ``names`` (all by default) in place from the code."""
    for name in names or TABLES:
        table = TABLES[name]
        text = table.path.read_text()
        pattern = block(name)
        if not pattern.search(text):
            sys.exit(f"{table.path}: no '{table.begin}' ... '{table.end}' block")
        table.path.write_text(pattern.sub(lambda m: m.group(1) + table.render() + m.group(3), text, count=1))
        print(f"wrote {name} into {table.path.relative_to(ROOT)}")


def check(names=None) -> int:
    """0 when every table ``names`` (all by default) is what the code renders; 1 otherwise."""
    stale = [name for name in names or TABLES if current(name) != TABLES[name].render()]
    for name in stale:
        print(f"{TABLES[name].path.relative_to(ROOT)}: table '{name}' differs from the code "
              f"(run `python tools/docs_tables.py {name}`)")
    return 1 if stale else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Render the docs' tables of defaults from the code.")
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"tables to render (default: all): {', '.join(TABLES)}"
    )
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 where a copy differs")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(TABLES))
    if unknown:
        parser.error(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    if args.check:
        return check(args.names)
    write(args.names)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
