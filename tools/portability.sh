#!/usr/bin/env bash
# The fast test profile (-m "not slow") on a second CPU instruction set and with hypothesis examples drawn from
# another seed: a test whose verdict depends on the machine's vector units or on one lucky draw fails here.
#   bash tools/portability.sh [ISA] [SEED] [TEST PATHS...]   (default paths: the whole fast profile)
# ISA: AVX (default: no FMA, unlike the AVX2 / AVX-512 machines the suite usually runs on), AVX2, AVX512.
# Not SSE4_2: with it XLA's CPU JIT lacks the float16 conversion routine __extendhfsf2, so every float16 test
# errors (jax 0.10.2). SEED: an integer (default: random, printed). CI runs AVX with a fixed seed (reproducible).
# It also compiles at XLA's own optimization level (the main suite compiles at level 0: tests/conftest.py).
set -euo pipefail
isa=${1:-AVX}
seed=${2:-$RANDOM$RANDOM}
shift $(( $# > 2 ? 2 : $# ))
echo "portability profile: XLA_FLAGS=--xla_cpu_max_isa=$isa (default optimization level), --hypothesis-seed=$seed"
SPECTRAL_OPTAX_TEST_OPT=default XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_max_isa=$isa" exec python -m pytest -q -n 2 -m "not slow" -p no:cacheprovider \
  --hypothesis-profile=portability --hypothesis-seed="$seed" "$@"
