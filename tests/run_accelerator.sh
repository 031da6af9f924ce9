#!/usr/bin/env bash
# Run the whole test suite and the accelerator benchmark preset on a machine
# where a CUDA or TPU build of JAX (with optax, flax, pytest, ...) is already
# installed. No network, no pip install: the project is put on PYTHONPATH.
#
#   tests/run_accelerator.sh LOGDIR [PYTEST_WORKERS]
#
# Writes into LOGDIR: environment.txt, pytest.log (+ junit.xml),
# optimizer_speed_gpu.log / .json, width_transfer_quick.log / .json, and
# summary.txt with every step's exit status. Each step has a time limit
# (SUITE_TIMEOUT, BENCH_TIMEOUT, LAB_TIMEOUT seconds) so that a run fits in a
# short device lease; STEPS selects the steps (default "suite bench lab"; e.g.
# STEPS=suite in one call and STEPS="bench lab" in the next when one command
# may run only 10 minutes); PYTEST_ARGS adds pytest options (e.g.
# "--deselect tests/test_notebooks.py"), BENCH_ARGS benchmark options (e.g.
# --quick for a dry run on a CPU). The exit status is that of the test
# suite when it ran, else that of the benchmark.
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 LOGDIR [PYTEST_WORKERS]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGDIR="$(mkdir -p "$1" && cd "$1" && pwd)"
WORKERS="${2:-6}"
SUITE_TIMEOUT="${SUITE_TIMEOUT:-420}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-420}"
STEPS="${STEPS:-suite bench lab}"
LAB_TIMEOUT="${LAB_TIMEOUT:-240}"
PY="${PYTHON:-python}"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# One process per test worker shares the accelerator: do not let each grab 75% of its memory.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
export MPLBACKEND=Agg

{
  date -u
  "$PY" -c "import jax, optax, flax, sys; print('python', sys.version.split()[0]); \
print('jax', jax.__version__, 'optax', optax.__version__, 'flax', flax.__version__); \
print('backend', jax.default_backend(), jax.devices())"
  "$PY" -c "import spectral_optax; print('spectral_optax from', spectral_optax.__file__)"
  command -v nvidia-smi >/dev/null && nvidia-smi
} > "$LOGDIR/environment.txt" 2>&1
cat "$LOGDIR/environment.txt"

status() { echo "$1: exit $2 ($(date -u +%H:%M:%S))" | tee -a "$LOGDIR/summary.txt"; }
: > "$LOGDIR/summary.txt"

has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
RC=0

# 1. The whole suite (pytest-xdist when installed).
if has suite; then
XDIST=()
if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "$WORKERS"); fi
timeout "$SUITE_TIMEOUT" "$PY" -m pytest -q -rfE "${XDIST[@]}" ${PYTEST_ARGS:-} --junitxml="$LOGDIR/junit.xml" tests \
  > "$LOGDIR/pytest.log" 2>&1
SUITE=$?
status pytest "$SUITE"
tail -n 30 "$LOGDIR/pytest.log"
fi

# 2. The accelerator preset of the speed benchmark.
if has bench; then
timeout "$BENCH_TIMEOUT" "$PY" -m benchmarks.optimizer_speed --preset gpu ${BENCH_ARGS:-} \
  --json "$LOGDIR/optimizer_speed_gpu.json" > "$LOGDIR/optimizer_speed_gpu.log" 2>&1
BENCH=$?
status optimizer_speed_gpu "$BENCH"
RC=$BENCH
tail -n 40 "$LOGDIR/optimizer_speed_gpu.log"
fi

# 3. The main lab job (nothing skipped on an accelerator).
if has lab; then
  timeout "$LAB_TIMEOUT" "$PY" -m benchmarks.width_transfer --quick --no-progress --out "$LOGDIR/lab" \
    --json "$LOGDIR/width_transfer_quick.json" > "$LOGDIR/width_transfer_quick.log" 2>&1
  status width_transfer_quick $?
  tail -n 15 "$LOGDIR/width_transfer_quick.log"
fi
cat "$LOGDIR/summary.txt"
exit "${SUITE:-$RC}"
