#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a build of their own: ZRT_SANITIZE=fuzzer, ASan + UBSan)
# and runs each for SECONDS from a seed corpus of valid files. Fails on any crash, leak, timeout or
# sanitizer report. ctest runs it briefly; for a longer campaign:
#   tests/fuzz/run_fuzzers.sh . /tmp/zrt-fuzz 600        # 10 minutes per target
# usage: run_fuzzers.sh SOURCE_DIR WORK_DIR SECONDS [TARGET...]
set -euo pipefail
src=$(cd "$1" && pwd); work=$2; seconds=${3:-20}; shift 3 || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(parsers_fuzz directory_fuzz hdf5_import_fuzz safetensors_fuzz)
command -v clang++ >/dev/null || { echo "SKIP: clang++ not installed"; exit 0; }
mkdir -p "$work"
cmake -S "$src" -B "$work/build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZRT_SANITIZE=fuzzer \
  -DZRT_BUILD_FUZZERS=ON -DZRT_BUILD_TESTS=OFF -DZRT_BUILD_BENCH=OFF -DZRT_WITH_CUDA=OFF > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j "$(nproc)" --target "${targets[@]}" > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  bin=$(find "$work/build" -name "$t" -type f -perm -u+x | head -1)
  rm -rf "$work/$t.corpus"; mkdir -p "$work/$t.corpus"
  ZRT_FUZZ_WRITE_SEEDS="$work/$t.corpus" "$bin" -runs=0 >/dev/null 2>&1 || true  # targets with seeds write them and exit
  echo "== $t: ${seconds}s"
  "$bin" -max_total_time="$seconds" -max_len=65536 -timeout=20 -rss_limit_mb=4096 -artifact_prefix="$work/$t-" \
    "$work/$t.corpus" > "$work/$t.log" 2>&1 || { tail -60 "$work/$t.log"; echo "FAIL: $t (artifacts in $work)"; exit 1; }
  grep -E "^#[0-9]+.*DONE|^Done" "$work/$t.log" | tail -1 || tail -2 "$work/$t.log"
done
echo "PASS: no crash in ${seconds}s of fuzzing per target"
