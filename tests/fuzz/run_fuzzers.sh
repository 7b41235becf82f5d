#!/usr/bin/env bash
# Builds the parser fuzz target with clang (libFuzzer + ASan + UBSan) and runs it for a bounded time
# from a seed corpus of valid files. Fails on any crash, leak or sanitizer report.
# usage: run_fuzzers.sh SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
src=$1; work=$2; seconds=${3:-20}
command -v clang++ >/dev/null || { echo "SKIP: clang++ not installed"; exit 0; }
rm -rf "$work"; mkdir -p "$work/corpus" "$work/include/zrt"
for m in core checkpoint; do ln -s "$src/$m" "$work/include/zrt/$m"; done  # the "zrt/..." include paths
flags=(-std=c++20 -O1 -g -I"$src" -I"$work/include" $(mpicxx --showme:compile) -DZRT_VERSION_STRING='"fuzz"')
libs=($(mpicxx --showme:link) -lzstd -lxxhash)
core=("$src"/core/{status,dtype,tensor_spec,shard_layout}.cc "$src"/checkpoint/{format,codec}.cc)
clang++ "${flags[@]}" "$src/tests/fuzz/seed_corpus.cc" "${core[@]}" "${libs[@]}" -o "$work/seed_corpus"
"$work/seed_corpus" "$work/corpus"
clang++ "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$src/tests/fuzz/parsers_fuzz.cc" "${core[@]}" "${libs[@]}" -o "$work/parsers_fuzz"
ASAN_OPTIONS=detect_leaks=1 "$work/parsers_fuzz" -max_total_time="$seconds" -max_len=8192 -timeout=10 \
  -artifact_prefix="$work/" "$work/corpus" 2>&1 | tail -5
echo "PASS: no crash in ${seconds}s of fuzzing"
