#!/usr/bin/env bash
# Runs every GPU test and the GPU benchmark on a machine with an NVIDIA GPU and CUDA 13,
# and ends with a summary table:
#   - the C++ suite sdpa_cuda_tests, and again under compute-sanitizer memcheck (the
#     kernels sdpa owns);
#   - the host time per call by stage (bench/cuda_host_overhead.cpp), and sdpa's CUDA
#     FLASH forward against CUDNN_ATTENTION, plain and with flex programs
#     (bench/cuda_flash_forward.cpp, bench/cuda_flash_flex.cpp);
#   - the Python CUDA tests (torch is the reference; torch.compile and a transformers
#     model on the GPU; flex score_mods on cuDNN), bench/compare_torch_cuda.py and
#     bench/compare_flex_cuda.py (flex on cuDNN against torch's compiled flex_attention).
#
#   bash scripts/gpu_check.sh [--quick]     # logs in $GPU_CHECK_OUT (build/gpu-check)
#   GPU_CHECK_SKIP="memcheck bench" bash scripts/gpu_check.sh   # leaves those steps out
#   GPU_CHECK_TARGETS=sdpa_cuda_tests ...                       # builds only those targets
#   GPU_CHECK_GTEST_FILTER='CudnnFlex*' GPU_CHECK_PYTESTS=python/tests/test_cuda_flex.py \
#     bash scripts/gpu_check.sh                                   # a subset of the tests
#   GPU_CHECK_BIN=carried/bin bash scripts/gpu_check.sh   # sdpa_cuda_tests (and the
#     benchmarks sdpa_cuda_host_overhead, sdpa_cuda_flash_forward, sdpa_cuda_flash_flex)
#     built elsewhere (same CUDA major, sm_80/90a): only the Python extension (and the
#     benchmarks not carried) is built here, beside the C++ tests; "build" in
#     GPU_CHECK_SKIP builds nothing
#   GPU_CHECK_NCU=1 ...   # also profiles two CUDA FLASH forward launches with ncu
#   GPU_CHECK_STEP_TIMEOUT=120 ...   # ends any step after that many seconds (exit 124)
#   GPU_CHECK_SHARDS=3 ...   # the C++ tests as that many parallel GoogleTest shards
#
# It builds the CUDA parts first (the C++ tests and the Python extension). Offline GPU
# machines: run scripts/gpu_deps.sh where there is network and bring .gpu-deps/ and
# .deps/cudnn-frontend along. cuDNN comes from the loader's path or from torch's
# nvidia-cudnn package (headers and library).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${GPU_CHECK_OUT:-$root/build/gpu-check}
rm -rf "$out" && mkdir -p "$out"
quick=${1:-}
declare -a rows=()
status=0
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records the result and time
  local name=$1; shift
  local t0=$SECONDS code=0
  if [[ " ${GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
    rows+=("| $name | skipped (GPU_CHECK_SKIP) | 0 s |")
    return 0
  fi
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs it in bash
    export -f "$1"
    set -- bash -c "$1"
  fi
  timeout "${GPU_CHECK_STEP_TIMEOUT:-0}" "$@" >"$out/$name.log" 2>&1 || code=$?
  if [ "$code" -eq 0 ]; then
    rows+=("| $name | pass | $((SECONDS - t0)) s |")
  else
    rows+=("| $name | FAIL (exit $code) | $((SECONDS - t0)) s |")
    status=1
    echo "---- $name failed; last lines of $out/$name.log:"
    tail -n 30 "$out/$name.log"
  fi
  return "$code"
}

prefix_path=""
if [ -d .gpu-deps/usr ]; then
  prefix_path="$root/.gpu-deps/usr"
  export LD_LIBRARY_PATH="$root/.gpu-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
if [ -n "$cudnn_dir" ]; then
  export CUDNN_ROOT="$cudnn_dir" LD_LIBRARY_PATH="$cudnn_dir/lib:$LD_LIBRARY_PATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
echo "GPU: $(cat "$out/gpu.txt"); $(nvcc --version | tail -n 1); cmake $(cmake --version | head -n 1 | cut -d' ' -f3)"

# Built for the GPU present (SDPA_GPU_ARCHS overrides): the CUDA tests, the Python
# extension and the host-overhead benchmark only.
step configure cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSDPA_CUDA=ON \
  -DSDPA_CUDNN=ON -DSDPA_BUILD_PYTHON=ON -DSDPA_BUILD_BENCH=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${SDPA_GPU_ARCHS:-native}" \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DPython_EXECUTABLE="$(command -v python3)"
bin=build/gpu/tests bench_bin=build/gpu/bench
if [ -n "${GPU_CHECK_BIN:-}" ]; then
  bin=$GPU_CHECK_BIN
  # Benchmarks not carried are built here, with the extension.
  [ -x "$GPU_CHECK_BIN/sdpa_cuda_flash_flex" ] && bench_bin=$GPU_CHECK_BIN
fi
if [ -n "${GPU_CHECK_BIN:-}" ] && [[ " ${GPU_CHECK_SKIP:-} " == *" build "* ]]; then
  rows+=("| build | skipped (GPU_CHECK_SKIP) | 0 s |")
elif [ -n "${GPU_CHECK_BIN:-}" ]; then
  # The extension (and missing benchmarks) build on the CPUs while the C++ tests use the GPU.
  build_t0=$SECONDS
  targets="_C"
  [ "$bench_bin" = build/gpu/bench ] && targets+=" sdpa_cuda_host_overhead sdpa_cuda_flash_forward sdpa_cuda_flash_flex sdpa_block_mask_build"
  # shellcheck disable=SC2086  # a list of targets
  cmake --build build/gpu --target $targets >"$out/build.log" 2>&1 &
  build_pid=$!
else
  step build cmake --build build/gpu --target ${GPU_CHECK_TARGETS:-sdpa_cuda_tests _C sdpa_cuda_host_overhead sdpa_cuda_flash_forward sdpa_cuda_flash_flex sdpa_block_mask_build}
fi
overhead=$bench_bin/sdpa_cuda_host_overhead
# GoogleTest's shards run as parallel processes: the flex tests spend most of their time
# compiling NVRTC units on one CPU core each.
export bin out
cpp_tests() {
  local shards=${GPU_CHECK_SHARDS:-1} pids=() code=0
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$bin/sdpa_cuda_tests" \
      --gtest_output="json:$out/cpp_tests_$i.json" --gtest_filter="${GPU_CHECK_GTEST_FILTER:-*}" \
      >"$out/cpp_tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || code=1; done
  cat "$out"/cpp_tests_*.log
  return "$code"
}
step cpp_tests cpp_tests
# memcheck slows kernels ~50x: the kernels sdpa owns (MATH, FLASH) on small shapes, one
# cuDNN call, streams and device memory; racecheck (shared memory) on the FLASH kernels.
step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/sdpa_cuda_tests" \
  --gtest_filter='CudaAttention.Math*:CudaAttention.CudnnTakesStridedInputs:CudaAttention.WorkRuns*:CudaAttention.Memory*:CudaAttention.Mixed*:CudaFlash.NativeBiases:CudaFlash.RowsWithoutKeys*:CudaFlash.TakesEveryHeadDim*:CudaFlash.ValueHeadDim*:CudaFlashFlex.CapturedTensorsOnTheDeviceAreReadInPlace:CudaFlashFlex.BlockListsWithoutAMaskModMatchTheGolden:CudaMathFlex.AnAttnMaskComposesInTheCpusOrder'
step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/sdpa_cuda_tests" \
  --gtest_filter='CudaFlash.ValueHeadDim*'

if [ -n "${build_pid:-}" ]; then
  if wait "$build_pid"; then
    rows+=("| build (extension) | pass | $((SECONDS - build_t0)) s |")
  else
    rows+=("| build (extension) | FAIL | $((SECONDS - build_t0)) s |")
    status=1
    tail -n 30 "$out/build.log"
  fi
fi
step host_overhead "$overhead"
# sdpa's CUDA FLASH forward against CUDNN_ATTENTION, plain and with flex programs (C++);
# create_block_mask at L = 131072 on this machine's cores (issue 23's 5 ms).
step flash_bench bash -c "$bench_bin/sdpa_cuda_flash_forward 10 1024 4096 && $bench_bin/sdpa_cuda_flash_flex && { [ ! -x $bench_bin/sdpa_block_mask_build ] || $bench_bin/sdpa_block_mask_build; }"
# With GPU_CHECK_NCU=1: Nsight Compute's full view (speed of light, occupancy, warp stalls,
# memory, instruction mix) of two CUDA FLASH forward launches, bfloat16 L = 4096, not
# causal: E = 64 (the benchmark's first launch) and E = 128 (its 15th: 7 launches per
# case, E = 64 causal second). Clocks as found (--clock-control none).
if [ -n "${GPU_CHECK_NCU:-}" ]; then
  flash_bench=$bench_bin/sdpa_cuda_flash_forward
  step ncu ncu --set full --clock-control none -k regex:forward_kernel -c 1 "$flash_bench" 1 4096
  step ncu128 ncu --set full --clock-control none -k regex:forward_kernel --launch-skip 14 -c 1 \
    "$flash_bench" 1 4096
fi

# The Python package of this tree with the extension just built.
stage=build/gpu/pystage
rm -rf "$stage" && mkdir -p "$stage" && cp -r python/sdpa "$stage/"
cp build/gpu/python/_C*.so "$stage/sdpa/" 2>/dev/null
export PYTHONPATH="$root/$stage:${PYTHONPATH:-}"
# pytest-xdist, where installed, keeps one crashing test from ending the run.
xdist=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 4")
pytests=${GPU_CHECK_PYTESTS:-python/tests/test_cuda.py python/tests/test_cuda_models.py python/tests/test_cuda_flex.py}
# shellcheck disable=SC2086  # a list of files
step py_tests python3 -m pytest -q -rs $xdist $pytests -p no:cacheprovider
step bench python3 bench/compare_torch_cuda.py ${quick:+--quick} --json "$out/bench.json"
step flex_bench python3 bench/compare_flex_cuda.py ${quick:+--quick} --json "$out/flex_bench.json"

echo
echo "## GPU check: $(cat "$out/gpu.txt")"
echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests ran" "$out/cpp_tests.log" 2>/dev/null | head -20
grep -E "(ERROR|RACECHECK) SUMMARY" "$out/memcheck.log" "$out/racecheck.log" 2>/dev/null
cat "$out/host_overhead.log" 2>/dev/null
grep -E "^\|" "$out/flash_bench.log" 2>/dev/null
for f in "$out/ncu.log" "$out/ncu128.log"; do
  [ -f "$f" ] && grep -E "forward_kernel|Duration|Throughput|Achieved Occupancy|Registers Per" "$f" | head -n 16
done
grep -E "^(FAILED|ERROR)" "$out/py_tests.log" 2>/dev/null | head -n 30
tail -n 1 "$out/py_tests.log" 2>/dev/null
[ -f "$out/bench.log" ] && tail -n 32 "$out/bench.log"
[ -f "$out/flex_bench.log" ] && tail -n 24 "$out/flex_bench.log"
exit $status
