"""``--devices N`` / ``--multihost`` for the benchmarks (no JAX import here).

The host-platform device count is read by XLA once, when JAX starts, so
:func:`early_flags` must run before ``import jax``: each benchmark calls it
at the top of its module (it only looks at ``sys.argv`` when the benchmark is
the program being run). ``--multihost`` calls ``jax.distributed.initialize()``
(one process per host on a TPU pod or GPU cluster, each running the same
command); sweeps then use every device of every host and process 0 writes
the results.
"""

from __future__ import annotations

import os
import sys


def early_flags(argv=None) -> None:
    """Set ``--xla_force_host_platform_device_count`` from ``--devices N`` before JAX starts."""
    if argv is None:
        main = sys.modules.get("__main__")
        if not getattr(main, "__spec__", None) or not str(main.__spec__.name).startswith("benchmarks."):
            return
        argv = sys.argv[1:]
    n = None
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--devices="):
            n = int(a.split("=", 1)[1])
    flags = os.environ.get("XLA_FLAGS", "")
    if n is not None and "xla_force_host_platform_device_count" not in flags:
        if "jax" in sys.modules:
            print("warning: --devices given after JAX started; the host device count is unchanged", file=sys.stderr)
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def add_arguments(p) -> None:
    p.add_argument("--devices", type=int, default=None,
                   help="split the sweeps' runs over N devices (N host CPU devices unless accelerators are present)")
    p.add_argument("--multihost", action="store_true",
                   help="jax.distributed.initialize() first and use every device of every host")


def setup(args):
    """``devices=`` for :func:`spectral_optax.lab.sweep` from the parsed flags (and start multi-host)."""
    import jax

    if args.multihost:
        jax.distributed.initialize()
        return "all"
    if args.devices:
        return min(args.devices, jax.device_count())
    return None


def is_writer() -> bool:
    """True on the process that writes results files and figures (process 0)."""
    import jax

    return jax.process_index() == 0
