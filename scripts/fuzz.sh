#!/usr/bin/env bash
# Builds the libFuzzer targets (the sanitize preset: clang, ASan + UBSan) and runs each for
# SECONDS (default 60) on a scratch copy of its seed corpus fuzz/corpus/<target>, then the
# Python target (fuzz/python_fuzzer.py, atheris) when a venv with sdpa is given.
#   scripts/fuzz.sh [SECONDS] [TARGET...]       targets: attention safetensors python
# Environment: SDPA_FUZZ_PYTHON (a python with sdpa and atheris installed; the python
# target is skipped without it), SDPA_FUZZ_SEED (libFuzzer's -seed, default 1, so that a
# CI run mutates the same way each time; 0 draws one).
# A crash, a timeout (10 s per input), a leak or an out-of-memory (2 GB) stops the run
# with the reproducer in build/sanitize/findings/; SDPA_MEMORY_LIMIT=1536M makes larger
# allocations the sdpa::Error they are on a small machine.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(attention safetensors python)

needs_cxx=0
for t in "${targets[@]}"; do [ "$t" = python ] || needs_cxx=1; done
if ((needs_cxx)); then
  cmake --preset sanitize >/dev/null
  cmake --build --preset sanitize --target attention_fuzzer safetensors_fuzzer
fi

findings=build/sanitize/findings
mkdir -p "$findings"
export SDPA_MEMORY_LIMIT="${SDPA_MEMORY_LIMIT:-1536M}"
export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
for t in "${targets[@]}"; do
  corpus="build/sanitize/corpus/$t"
  rm -rf "$corpus" && mkdir -p "$corpus"
  cp -r "fuzz/corpus/$t/." "$corpus/"
  echo "== fuzzing $t for ${seconds} s"
  if [ "$t" = python ]; then
    if [ -z "${SDPA_FUZZ_PYTHON:-}" ]; then
      echo "skipped: SDPA_FUZZ_PYTHON names no python with sdpa and atheris"
      continue
    fi
    "$SDPA_FUZZ_PYTHON" fuzz/python_fuzzer.py "$corpus" -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=4096 -seed="${SDPA_FUZZ_SEED:-1}" \
      -artifact_prefix="$findings/python-"
  else
    "build/sanitize/fuzz/${t}_fuzzer" "$corpus" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -seed="${SDPA_FUZZ_SEED:-1}" -artifact_prefix="$findings/$t-" \
      -print_final_stats=1
  fi
done
