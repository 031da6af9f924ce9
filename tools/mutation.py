"""In-process mutation testing of spectral_optax with mutmut's mutants.

``mutmut run`` starts a process per mutant (and JAX needs ``forkserver``
isolation: forking a process that has initialized JAX deadlocks), about 20 s
per mutant on a 2-core machine. This driver uses mutmut (>= 3.8) only to
*generate* the mutants (trampolines: the active mutant is chosen at call
time), imports the mutated package once, and for each mutant sets it active,
clears JAX's compilation caches (a jitted function traced under the previous
mutant would otherwise be reused) and the package's ``functools`` caches,
and runs the tests that reach the mutated function with ``pytest.main`` in
the same process. See docs/reliability.md ("Mutation testing").

Steps (each resumable; results are appended to files in ``--work``)::

    python tools/mutation.py generate            # copy the package + tests, let mutmut write mutants/
    python tools/mutation.py stats               # which test reaches which function (one clean run)
    python tools/mutation.py check               # the clean code passes; the forced-fail mutant fails
    python tools/mutation.py run --sample 400    # stratified random sample (fixed seed), or all mutants
    python tools/mutation.py report              # killed / total, survivors, 95% interval
    # after writing tests for the survivors:
    python tools/mutation.py sync-tests && python tools/mutation.py stats --tests tests/test_<new>.py
    python tools/mutation.py run --sample 400 --rerun-survivors --first tests/test_<new>.py

Run it niced and single-threaded on a shared machine::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        nice -n 10 python tools/mutation.py run --sample 400

``--work`` (default ``/tmp/spectral_optax_mutation``) is a scratch copy; the
repository is never modified.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: What is mutated: the whole package (geometry, dual maps with Newton-Schulz, the distributed plan and its
#: execution, transforms, optimizers, initializers, depth scaling, diagnostics, transfer rules, lab, nn).
SCOPE = [
    "spectral_optax/*.py",
    "spectral_optax/_geometry/*.py",
    "spectral_optax/_duals/*.py",
    "spectral_optax/_duals/polar/*.py",
    "spectral_optax/_mesh/*.py",
    "spectral_optax/_distributed/*.py",
    "spectral_optax/_transforms/*.py",
    "spectral_optax/_optimizers/*.py",
    "spectral_optax/diagnostics/*.py",
    "spectral_optax/lab/*.py",
    "spectral_optax/nn/*.py",
]

#: The unit tests of the transforms and optimizers run against each mutant (the
#: hypothesis property tests, notebooks, subprocess and multi-device tests are left out: slow).
TEST_FILES = [
    "tests/test_reference_multistep.py",
    "tests/test_bad_values.py",
    "tests/test_row_column.py",
    "tests/test_muon.py",
    "tests/test_moga.py",
    "tests/test_parametrization.py",
    "tests/test_spectral.py",
    "tests/test_depth.py",
    "tests/test_conventions.py",
    "tests/test_newton_schulz.py",
    "tests/test_one_step.py",
    "tests/test_trust_ratio.py",
    "tests/test_geometry.py",
    "tests/test_trace_geometry.py",
    "tests/test_golden.py",
    "tests/test_reinitialize.py",
    "tests/test_tied_embeddings.py",
    "tests/test_diagnostics.py",
    "tests/test_stable_rank.py",
    "tests/test_transfer.py",
    "tests/test_qk_clip.py",
    "tests/test_normuon.py",
    "tests/test_regret.py",
    # the tests written for earlier survivors, in the per-module files they joined
    "tests/test_moga_options.py",
    "tests/test_weight_decay.py",
    "tests/test_momentum.py",
    "tests/test_contrib_muon.py",
    "tests/test_muon_options.py",
    "tests/test_orthogonalize.py",
    "tests/test_name_rules.py",
    "tests/test_flax_hints.py",
    "tests/test_jaxpr_walk.py",
    "tests/test_lab_models.py",
    "tests/test_nn_sharded.py",
    "tests/test_neuron_norm.py",
    "tests/test_mesh_layout.py",
    "tests/test_sweep.py",
    "tests/test_lab_summary.py",
    "tests/test_data.py",
    "tests/test_nn.py",
    "tests/test_initializers.py",
    "tests/test_shard_map.py",
]

PYTEST_ARGS = ["-x", "-qq", "--tb=no", "-rN", "--no-header", "-p", "no:cacheprovider", "-W", "ignore::UserWarning"]


def _setup_cfg(scope: list[str]) -> str:
    lines = ["[mutmut]", "source_paths=spectral_optax", "only_mutate="]
    lines += [f"    {s}" for s in scope]
    lines += ["also_copy=", "    tests", "    pyproject.toml", "process_isolation=forkserver", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- generate
def generate(work: Path, scope: list[str]) -> None:
    """Copy the package and tests into ``work`` and let mutmut write ``work/mutants``."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copytree(REPO / "spectral_optax", work / "spectral_optax", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")
    (work / "setup.cfg").write_text(_setup_cfg(scope))
    os.chdir(work)
    from mutmut import __main__ as mm  # noqa: PLC0415  (after chdir: mutmut reads setup.cfg from the cwd)
    from mutmut.mutation.trampoline import set_mutant_under_test  # noqa: PLC0415

    set_mutant_under_test("mutant_generation")
    os.makedirs("mutants", exist_ok=True)
    mm.copy_src_dir()
    mm.copy_also_copy_files()
    mm.create_mutants(2)
    # tests/test_golden.py reads its cases from tools/golden_updates.py, test_one_step.py imports benchmarks/
    (work / "mutants" / "tools").mkdir(exist_ok=True)
    shutil.copy2(REPO / "tools" / "golden_updates.py", work / "mutants" / "tools" / "golden_updates.py")
    shutil.copytree(REPO / "benchmarks", work / "mutants" / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    names = mutant_names(work)
    print(f"{len(names)} mutants in {len({n.rpartition('.x')[0] for n in names})} modules -> {work / 'mutants'}")


def mutant_names(work: Path) -> list[str]:
    """Every mutant's name, in file order (from mutmut's ``.meta`` files)."""
    names = []
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        names += list(json.loads(meta.read_text())["exit_code_by_key"])
    return names


def function_of(mutant: str) -> str:
    return mutant.partition("__mutmut_")[0]


def module_of(mutant: str) -> str:
    return function_of(mutant).rpartition(".")[0]


# ----------------------------------------------------------------------------- in-process runner
class _Timeout(Exception):
    pass


class Runner:
    """The mutated package imported once; each call runs tests under one mutant."""

    def __init__(self, work: Path):
        self.work = work
        os.chdir(work / "mutants")
        sys.path.insert(0, str(work / "mutants"))
        import jax  # noqa: PLC0415
        import pytest  # noqa: PLC0415
        from mutmut.mutation.trampoline import set_mutant_under_test  # noqa: PLC0415

        import spectral_optax  # noqa: PLC0415

        assert Path(spectral_optax.__file__).resolve().is_relative_to(work / "mutants"), spectral_optax.__file__
        self.jax, self.pytest, self.set_mutant = jax, pytest, set_mutant_under_test
        self.timed_out = False
        self.failed: list[str] = []

    def _clear_caches(self) -> None:
        self.jax.clear_caches()
        for name, module in list(sys.modules.items()):
            if name.startswith("spectral_optax") and module is not None:
                for value in list(vars(module).values()):
                    if callable(getattr(value, "cache_clear", None)):
                        value.cache_clear()

    def run(self, mutant: str, tests: list[str], timeout: float, plugins=(), stop_first: bool = True) -> int:
        """pytest's exit code for ``tests`` with ``mutant`` active (0: all passed); ``stop_first``:
        at the first failure (``-x``)."""
        self.set_mutant(mutant)
        self._clear_caches()
        self.timed_out = False
        self.failed = []
        failed = self.failed

        class Failures:
            def pytest_runtest_logreport(self, report):
                if report.failed:
                    failed.append(report.nodeid)

        def on_alarm(signum, frame):
            self.timed_out = True
            raise _Timeout(f"mutant {mutant} ran past {timeout:.0f} s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            args = PYTEST_ARGS if stop_first else [a for a in PYTEST_ARGS if a != "-x"]
            return int(self.pytest.main([*tests, *args], plugins=[*plugins, Failures()]))
        except _Timeout:
            return 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            self.set_mutant("")


# ----------------------------------------------------------------------------- stats
def stats(work: Path, tests: list[str]) -> None:
    """Which tests reach which mutated function, and each test's duration (clean code)."""
    runner = Runner(work)
    from mutmut.state import state  # noqa: PLC0415

    by_function: dict[str, set[str]] = defaultdict(set)
    duration: dict[str, float] = {}
    clear = runner._clear_caches

    class Collector:
        def pytest_runtest_setup(self, item):
            clear()  # every test traces afresh, so every trampoline it reaches records a hit
            state()._stats.clear()
            self.t0 = time.perf_counter()

        def pytest_runtest_teardown(self, item, nextitem):
            duration[item.nodeid] = time.perf_counter() - self.t0
            for f in state()._stats:
                by_function[f].add(item.nodeid)
            state()._stats.clear()

    t0 = time.perf_counter()
    selected = [t for t in tests if (work / "mutants" / t).exists()]
    code = runner.run("stats", selected, 7200.0, [Collector()], stop_first=False)
    clean_failures = sorted(runner.failed)  # tests failing on the clean copy: never used to judge a mutant
    old_path = work / "stats.json"
    if old_path.exists():  # merge: a later stats run (e.g. of a new test file) adds to the earlier one
        old = json.loads(old_path.read_text())
        rerun = tuple(f"{t.split('::')[0]}::" for t in tests)  # the files just run replace their old entries
        for k, v in old["tests_by_function"].items():
            by_function[k] |= {t for t in v if not t.startswith(rerun)}
        duration = {**{t: d for t, d in old["duration_by_test"].items() if not t.startswith(rerun)}, **duration}
        kept = {t for t in old.get("clean_failures", []) if not t.startswith(rerun)}
        clean_failures = sorted(kept | set(clean_failures))
    for k in by_function:
        by_function[k] -= set(clean_failures)
    out = {
        "exit_code": code,
        "seconds": time.perf_counter() - t0,
        "tests_by_function": {k: sorted(v) for k, v in by_function.items()},
        "duration_by_test": duration,
        "clean_failures": clean_failures,
    }
    (work / "stats.json").write_text(json.dumps(out, indent=1))
    print(
        f"stats: exit code {code}, {len(duration)} tests, {len(by_function)} functions reached, {out['seconds']:.0f} s"
    )
    if clean_failures:
        print("failing on the clean copy (left out of every mutant's tests):", *clean_failures, sep="\n  ")


def sync_tests(work: Path) -> None:
    """Copy the repository's test files into the mutants' copy (after writing new tests)."""
    for f in sorted((REPO / "tests").glob("*.py")):
        shutil.copy2(f, work / "mutants" / "tests" / f.name)
    print(f"copied {REPO / 'tests'}/*.py to {work / 'mutants' / 'tests'}")


def _load_stats(work: Path):
    s = json.loads((work / "stats.json").read_text())
    return s["tests_by_function"], s["duration_by_test"]


def tests_for(mutant: str, tests_by_function, duration_by_test) -> list[str]:
    """The tests that reach the mutated function, fastest first (``-x`` stops at the first kill).

    ``run --budget S`` keeps the first ones whose clean durations add up to at most ``S`` seconds."""
    return sorted(tests_by_function.get(function_of(mutant), []), key=lambda t: duration_by_test.get(t, 0.0))


# ----------------------------------------------------------------------------- check / run
def check(work: Path, names: list[str], clean: bool, only: str | None = None) -> None:
    """The forced-fail mutant fails the tests (and, with ``clean``, the clean code passes
    them all: ``stats`` already ran them on the clean code); then each named mutant."""
    tests_by_function, duration_by_test = _load_stats(work)
    runner = Runner(work)
    tests = sorted({t for ts in tests_by_function.values() for t in ts}, key=lambda t: duration_by_test.get(t, 0.0))
    if clean:
        print(f"clean run of {len(tests)} tests: exit code {runner.run('', tests, 3600.0)} (want 0)")
    print(f"forced-fail mutant: exit code {runner.run('fail', tests[:3], 600.0)} (want 1)")
    for name in names:
        tests = [t for t in tests_for(name, tests_by_function, duration_by_test) if t.startswith(only or "")]
        code = runner.run(name, tests, 600.0)
        print(name, "killed" if code else "survived", f"(exit code {code})", *runner.failed[:1], flush=True)


def reachable(work: Path) -> list[str]:
    """The mutants of functions that some selected test reaches (``stats``); the others
    (code run only on multi-device meshes, in subprocess tests) are reported, not run."""
    tests_by_function, _ = _load_stats(work)
    return [n for n in mutant_names(work) if function_of(n) in tests_by_function]


def unreached(work: Path) -> dict[str, int]:
    tests_by_function, _ = _load_stats(work)
    out: dict[str, int] = defaultdict(int)
    for n in mutant_names(work):
        if function_of(n) not in tests_by_function:
            out[function_of(n)] += 1
    return dict(out)


def select(names: list[str], sample: int | None, seed: int) -> list[str]:
    """All mutants, or a random sample stratified by source file (proportional, fixed seed)."""
    if not sample or sample >= len(names):
        return names
    by_file = defaultdict(list)
    for n in names:
        by_file[module_of(n)].append(n)
    rng = random.Random(seed)
    # Largest-remainder proportional allocation, at least one mutant per file.
    quotas = {f: max(1, sample * len(v) / len(names)) for f, v in by_file.items()}
    counts = {f: int(q) for f, q in quotas.items()}
    for f in sorted(quotas, key=lambda f: quotas[f] - counts[f], reverse=True)[: sample - sum(counts.values())]:
        counts[f] += 1
    chosen = []
    for f in sorted(by_file):
        chosen += rng.sample(by_file[f], min(counts[f], len(by_file[f])))
    rng.shuffle(chosen)  # run order random too: a run stopped early is still a random sample
    return chosen


def _rows(results: Path) -> dict[str, dict]:
    rows = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["mutant"]] = r  # a later line (a re-run) wins
    return rows


def killers_first(results: Path, first: list[str]):
    """``(mutant, tests) -> tests`` reordered: the tests in ``first`` (new test files), then the
    tests that killed other mutants of the same function, then of the same module, then the rest."""
    by_function: dict[str, set[str]] = defaultdict(set)
    by_module: dict[str, set[str]] = defaultdict(set)
    for name, r in _rows(results).items():
        for t in r.get("killed_by") or []:
            by_function[function_of(name)].add(t)
            by_module[module_of(name)].add(t)

    def order(mutant: str, tests: list[str]) -> list[str]:
        def rank(t: str) -> int:
            if any(t.startswith(f) for f in first):
                return 0
            if t in by_function[function_of(mutant)]:
                return 1
            return 2 if t in by_module[module_of(mutant)] else 3

        return sorted(tests, key=rank)  # stable: fastest first within a rank

    return order


def run(
    work: Path,
    names: list[str],
    results: Path,
    min_timeout: float,
    budget: float | None = None,
    order=None,
    rerun: bool = False,
    extra: list[str] | None = None,
    only: str | None = None,
) -> None:
    """Run each mutant (skipping those already in ``results`` unless ``rerun``); append one JSON line each."""
    tests_by_function, duration_by_test = _load_stats(work)
    done = {} if rerun else {k: 1 for k in _rows(results)}
    running = results.with_suffix(".running")
    if running.exists():  # the previous run died on this mutant (a hang in compiled code): a timeout
        name = running.read_text().strip()
        if name and name not in done:
            with results.open("a") as f:
                f.write(json.dumps({"mutant": name, "status": "timeout", "seconds": None, "tests": None}) + "\n")
            done[name] = 1
    runner = Runner(work)
    todo = [n for n in names if n not in done]
    print(f"{len(todo)} mutants to run ({len(done)} done)", flush=True)
    for i, name in enumerate(todo):
        tests = [t for t in tests_for(name, tests_by_function, duration_by_test) if t.startswith(only or "")]
        if order is not None:
            tests = order(name, tests)
        if budget is not None:
            kept, total = [], 0.0
            for t in tests:
                if kept and total + duration_by_test.get(t, 0.0) > budget:
                    continue
                kept.append(t)
                total += duration_by_test.get(t, 0.0)
            tests = kept
        tests = tests + [t for t in extra or [] if t not in tests]
        t0 = time.perf_counter()
        if not tests:
            status, code = "no tests", None
        else:
            running.write_text(name)
            limit = max(min_timeout, 10.0 * sum(duration_by_test.get(t, 1.0) for t in tests))
            code = runner.run(name, tests, limit)
            # 1: a test failed; anything else but 0 (a node id not found, an internal error) is not a kill.
            status = "timeout" if runner.timed_out else {0: "survived", 1: "killed"}.get(code, "error")
        row = {
            "mutant": name,
            "status": status,
            "exit_code": code,
            "seconds": round(time.perf_counter() - t0, 2),
            "tests": len(tests),
            "budget": budget,
            "killed_by": runner.failed[:1] if tests else [],
        }
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        running.write_text("")
        print(f"[{i + 1}/{len(todo)}] {status:9s} {row['seconds']:7.1f}s {name}", flush=True)


# ----------------------------------------------------------------------------- report
def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a binomial proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def report(results: Path, equivalent: Path | None, total_mutants: int, n_reachable: int, not_reached) -> None:
    rows = _rows(results)
    eq = set()
    if equivalent is not None and equivalent.exists():
        eq = {ln.split()[0] for ln in equivalent.read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    by_file: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, r in rows.items():
        status = "equivalent" if (r["status"] == "survived" and name in eq) else r["status"]
        by_file[module_of(name)][status] += 1
    statuses = ["killed", "timeout", "survived", "equivalent", "error", "no tests"]
    print("| module | " + " | ".join(statuses) + " | total |")
    print("|---|" + "---|" * (len(statuses) + 1))
    total = defaultdict(int)
    for f in sorted(by_file):
        print(f"| `{f}` | " + " | ".join(str(by_file[f][s]) for s in statuses) + f" | {sum(by_file[f].values())} |")
        for s in statuses:
            total[s] += by_file[f][s]
    n = sum(total.values())
    print("| **all** | " + " | ".join(str(total[s]) for s in statuses) + f" | {n} |")
    detected = total["killed"] + total["timeout"]
    lo, hi = wilson(detected, n)
    print(
        f"\nkilled (incl. timeouts) / checked: {detected} / {n} = {detected / max(n, 1):.1%} "
        f"(95% Wilson interval {lo:.1%} .. {hi:.1%})"
    )
    m = n - total["equivalent"]
    lo, hi = wilson(detected, m)
    print(
        f"without the equivalent mutants: {detected} / {m} = {detected / max(m, 1):.1%} "
        f"(95% Wilson interval {lo:.1%} .. {hi:.1%})"
    )
    print(
        f"\n{total_mutants} mutants in all; {n_reachable} in functions the selected tests reach (the population "
        f"sampled); {total_mutants - n_reachable} in functions reached only by the multi-device subprocess tests:"
    )
    for f, k in sorted(not_reached.items()):
        print(f"  {k:4d} {f}")
    surv = sorted(k for k, r in rows.items() if r["status"] in ("survived", "no tests", "error") and k not in eq)
    if surv:
        print("\nnot killed:\n  " + "\n  ".join(f"{k} ({rows[k]['status']})" for k in surv))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["generate", "sync-tests", "stats", "check", "run", "report", "list"])
    ap.add_argument("names", nargs="*", help="mutant names (check / run: only these)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/spectral_optax_mutation"))
    ap.add_argument("--sample", type=int, default=None, help="stratified random sample of this many mutants")
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--results", type=Path, default=None, help="JSON lines (default: WORK/results.jsonl)")
    ap.add_argument("--equivalent", type=Path, default=REPO / "tools" / "mutation_equivalent.txt")
    ap.add_argument("--min-timeout", type=float, default=120.0, help="seconds per mutant at least")
    ap.add_argument("--tests", nargs="*", default=TEST_FILES)
    ap.add_argument("--clean", action="store_true", help="check: also run every selected test on the clean code")
    ap.add_argument("--only", default=None, help="check, run: only the tests whose node id starts with this")
    ap.add_argument("--rerun-survivors", action="store_true", help="run: re-run the survivors among the names")
    ap.add_argument(
        "--first",
        nargs="*",
        default=["tests/test_moga_options.py", "tests/test_muon_options.py", "tests/test_momentum.py"],
        help="run --rerun-survivors: tests run first (then the killers of the same function)",
    )
    ap.add_argument(
        "--extra",
        nargs="*",
        default=None,
        help="run: tests appended for every mutant (e.g. the multi-device subprocess tests)",
    )
    ap.add_argument("--budget", type=float, default=None, help="run: clean seconds of tests per mutant at most")
    a = ap.parse_intermixed_args(argv)
    work = a.work.resolve()
    results = (a.results or work / "results.jsonl").resolve()
    if a.step == "generate":
        generate(work, SCOPE)
    elif a.step == "sync-tests":
        sync_tests(work)
    elif a.step == "stats":
        stats(work, a.tests)
    elif a.step == "check":
        check(work, a.names, a.clean, a.only)
    elif a.step == "list":
        print("\n".join(select(reachable(work), a.sample, a.seed)))
    elif a.step == "run":
        names = a.names or select(reachable(work), a.sample, a.seed)
        order = None
        if a.rerun_survivors:
            rows = _rows(results)
            names = [n for n in names if rows.get(n, {}).get("status") in ("survived", "error")]
            order = killers_first(results, a.first)
        run(work, names, results, a.min_timeout, a.budget, order, rerun=a.rerun_survivors, extra=a.extra, only=a.only)
    else:
        report(results, a.equivalent, len(mutant_names(work)), len(reachable(work)), unreached(work))


if __name__ == "__main__":
    main()
