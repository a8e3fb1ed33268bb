#!/usr/bin/env bash
# Runs the benchmark set on this machine and writes bench/results/HOST_KIND/*.json, then
# regenerates docs/benchmarks.md from every host kind's results. Builds nothing: build
# the release preset first. About 5 minutes on an idle 2-core host.
#
#   bench/run_all.sh HOST_KIND      e.g. intel-xeon-avx512-amx, amd-zen4-avx512
#
# HOST_KIND names the CPU kind (vendor, family, widest ISA) so that runs on equal machines
# replace each other's results. Environment:
#   SDPA_BUILD_DIR      where the binaries are (default build/release)
#   SDPA_PYTHON         interpreter for compare_torch.py (default python3); it needs torch
#                       and the sdpa package, else that benchmark is skipped with a note
#   SDPA_BENCH_THREADS  threads for every benchmark (default: all cores)
#   SDPA_CPU_CAPABILITY run sdpa's kernels at a lower level (AVX2, DEFAULT); torch then runs
#                       at the same level unless set otherwise: ATEN_CPU_CAPABILITY for its
#                       own kernels, ONEDNN_MAX_CPU_ISA for the GEMMs it hands to oneDNN.
#                       Name such a run's HOST_KIND after the level, e.g. amd-zen5-avx2-level.
set -euo pipefail

if [[ $# -ne 1 || ! $1 =~ ^[a-z0-9][a-z0-9._-]*$ ]]; then
  echo "usage: bench/run_all.sh HOST_KIND   (lower-case letters, digits, . _ -)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."  # the recorded commands are relative to the repository root
build=${SDPA_BUILD_DIR:-build/release}
python=${SDPA_PYTHON:-python3}
threads=${SDPA_BENCH_THREADS:-$(nproc)}
out=bench/results/$1
for program in "$build/tools/sdpa" "$build/bench/sdpa_mask_ratios" \
               "$build/bench/sdpa_block_mask_build" "$build/bench/sdpa_decode_bandwidth" \
               "$build/bench/sdpa_paged_decode" "$build/bench/sdpa_chunked_prefill"; do
  [[ -x $program ]] || { echo "missing $program: build the release preset first" >&2; exit 1; }
done
mkdir -p "$out"
rm -f "$out"/*.json  # one run's results per host kind; older ones live in git history
export OMP_NUM_THREADS=$threads
if [[ -n ${SDPA_CPU_CAPABILITY:-} ]]; then
  export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-${SDPA_CPU_CAPABILITY,,}}
  case ${SDPA_CPU_CAPABILITY} in
    AVX2) export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2} ;;
    DEFAULT) export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-SSE41} ;;
  esac
fi
sdpa=$build/tools/sdpa

step() { echo "== $*" >&2; }

step "machine peaks"
"$sdpa" bench --peak-only --json >"$out/peaks.json"
# MATH is the unblocked reference: 3 repeats of its L=2048 backward take about a minute.
step "FLASH vs MATH, forward and backward"
"$sdpa" bench --heads-q 16 --seq-lens 2048 --head-dim 64 --backward --peak --repeats 3 \
  --json >"$out/flash_vs_math.json"
# One timed call per length: these rows are for peak_extra_bytes, which does not vary.
step "FLASH memory at long sequences"
"$sdpa" bench --heads-q 16 --seq-lens 4096,16384 --causal on --backends flash --backward \
  --repeats 1 --warmup 0 --json >"$out/flash_memory.json"
step "mask, bias and flex ratios"
"$build/bench/sdpa_mask_ratios" 7 --json "$out/mask_ratios.json"
step "create_block_mask at L=131072"
"$build/bench/sdpa_block_mask_build" --json "$out/block_mask_build.json"
step "decode bandwidth"
"$build/bench/sdpa_decode_bandwidth" 30 --json "$out/decode_bandwidth.json"
step "paged KV-cache decode (about 5 GB of K/V)"
"$build/bench/sdpa_paged_decode" 7 16 --json "$out/paged_decode.json"
step "chunked prefill on a paged KV cache"
"$build/bench/sdpa_chunked_prefill" 7 16 --json "$out/chunked_prefill.json"
step "comparison with torch"
if "$python" -c "import torch, sdpa" 2>/dev/null; then
  # It exits 1 when a case disagrees with torch, after writing its JSON (the page marks
  # those rows): render the rest all the same.
  "$python" bench/compare_torch.py --repeats 7 --threads "$threads" \
    --sdpa-cli "$sdpa" --json "$out/compare_torch.json" ||
    echo "compare_torch.py failed: see its output above" >&2
  "$python" bench/compare_torch.py --small --repeats 15 --threads "$threads" \
    --sdpa-cli "$sdpa" --json "$out/compare_torch_small.json" ||
    echo "compare_torch.py --small failed: see its output above" >&2
  step "context parallelism over gloo ranks"
  "$python" bench/context_parallel.py --ranks "$threads" --json "$out/context_parallel.json" ||
    echo "context_parallel.py failed: see its output above" >&2
else
  echo "skipped: '$python' cannot import torch and sdpa (set SDPA_PYTHON)" >&2
fi

python3 bench/render_benchmarks.py
echo "wrote $out/*.json and docs/benchmarks.md" >&2
