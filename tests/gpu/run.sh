#!/usr/bin/env bash
# Everything GPU-side in one call (the GPU machine's `run` tool; keep it under 8 minutes):
# builds for sm_90 only, runs the GPU test suites, then the GPU benchmarks, and prints a table last.
#   tests/gpu/run.sh [build-dir]
# The GPU machine has CUDA, NCCL and CMake but not zrt's Debian libraries, and no network: run
# `tests/gpu/deps.sh fetch` here first and carry .gpu-deps (run tool: carry [".gpu-deps"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-gpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

source tests/gpu/deps.sh  # the carried libraries, where the machine lacks them

# Build only what the GPU checks need, for this GPU's architecture.
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DZRT_WITH_CUDA=ON -DZRT_WITH_NCCL=ON \
  "${ZRT_DEPS_CMAKE_ARGS[@]}" >"$dir/configure.log" 2>&1 \
  || { tail -30 "$dir/configure.log"; exit 1; }
cmake --build "$dir" -j "$(nproc)" --target zrt_gpu_test zrt_gpu_mpi_test adam_gpu_bench engine_gpu_bench charlm 2>&1 | tail -5

status=0
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
mpi="mpirun --oversubscribe --bind-to none"
echo "== GPU tests"
timeout 120 "./$dir/tests/gpu/zrt_gpu_test" || status=1
echo "== compute-sanitizer memcheck of the kernels"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then  # it cannot attach on some runtimes (gVisor): that is reported, not a failure
  memcheck=$(timeout 90 "$sanitizer" --tool memcheck "./$dir/tests/gpu/zrt_gpu_test" \
    --gtest_filter='AdamCuda.SkipFlag*:GradSumSquaresCuda.*:CastCuda.*' 2>&1)
  summary=$(echo "$memcheck" | grep -a "ERROR SUMMARY" | tail -1)
  echo "${summary:-memcheck did not run here: $(echo "$memcheck" | tail -2 | tr '\n' ' ')}"
  case "$summary" in *" 0 errors"*|"") ;; *) echo "$memcheck" | grep -a -m 20 "Invalid\|at 0x\|by thread"; status=1 ;; esac
fi
echo "== NCCL communicator and engine on the GPU (1 rank)"
timeout 180 $mpi -np 1 "./$dir/tests/gpu/zrt_gpu_mpi_test" || status=1
if [ "$gpus" -ge 2 ]; then  # NCCL refuses two ranks on one GPU
  echo "== multi-GPU (NCCL) checks: $gpus GPUs"
  timeout 180 $mpi -np "$gpus" "./$dir/tests/gpu/zrt_gpu_mpi_test" || status=1
else
  echo "== multi-GPU (NCCL) checks skipped: $gpus GPU(s)"
fi

echo "== charlm on the GPU: killed, resumed, bit-identical"
timeout 150 tests/gpu/charlm_gpu.sh "./$dir/examples/charlm/charlm" "${TMPDIR:-/tmp}/zrt_charlm_gpu" 1 || status=1

echo "== GPU benchmarks"
results=$(mktemp)
peer_out=$(timeout 120 python3 tests/gpu/torch_fused_adamw.py $((256 << 20)) 20 2>&1)
echo "$peer_out"
peer=$(echo "$peer_out" | awk '/^PEER_GELEMS/ {print $2}')
timeout 120 "./$dir/bench/adam_gpu_bench" --elements $((256 << 20)) --reps 20 --peer-gelems "${peer:--1}" | tee -a "$results"
timeout 240 $mpi -np 1 "./$dir/bench/engine_gpu_bench" --params $((1 << 30)) --steps 3 --ckpt-dir "${TMPDIR:-/tmp}/zrt_gpu_ckpt" \
  | tee -a "$results" || status=1

echo
echo "== summary"
{ printf 'bench\tcase\tfigure\tunit\tlimit\tlimit is\tratio\tpeer\tpeer is\n'; grep '^RESULT' "$results" | cut -f2-; } | column -t -s $'\t'
exit $status
