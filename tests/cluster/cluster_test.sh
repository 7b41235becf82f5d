#!/usr/bin/env bash
# zrt on emulated nodes (scripts/cluster; docs/cluster.md), checked from outside:
#   1. the root namespace is untouched: its links, addresses, routes, qdiscs and /etc/hosts are the
#      same before and after every run, and a run leaves no namespace or /etc/netns entry behind;
#   2. what a killed run leaves (a stale namespace) is cleaned by the next;
#   3. the hybrid suite on 2 nodes x 2 ranks over 1 Gbit/s links and on 3 nodes x 2 ranks (shared
#      memory inside a node, TCP between nodes);
#   4. charlm at stage 3, hybrid (S = 2 = a node), on 2 x 2 ranks: every rank of node b SIGKILLed at a
#      random moment, the job restarted from disk, the final parameters bit-identical to an
#      uninterrupted run of the same mesh; then resumed on one node (4 -> 2 ranks, resharded).
# Exits 77 (skipped) where network namespaces cannot be made.
# usage: cluster_test.sh CLUSTER_SCRIPT HYBRID_TEST CHARLM WORKDIR
set -euo pipefail
cluster=$1; hybrid=$2; charlm=$3; work=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ZRT_LOG_LEVEL=warn

if ! why=$("$cluster" check); then
  echo "SKIP: $why"
  exit 77
fi

root_state() {
  ip -o link | sed 's/ link\/.*//'; ip -o addr; ip route; ip -6 route; tc qdisc; cat /etc/hosts
}
before=$(root_state)
check_root() {
  local now
  now=$(root_state)
  if [ "$now" != "$before" ]; then
    echo "FAIL: the root namespace changed ($1)"; diff <(echo "$before") <(echo "$now") || true; exit 1
  fi
  if ip netns list | grep -q "^zrtc"; then echo "FAIL: namespaces left after $1: $(ip netns list | tr '\n' ' ')"; exit 1; fi
  if ls /etc/netns 2>/dev/null | grep -q "^zrtc"; then echo "FAIL: /etc/netns entries left after $1"; exit 1; fi
  echo "   root namespace unchanged, nothing left ($1)"
}

rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}

echo "== a killed run's leftovers are cleaned"
ip netns add zrtc999999-a  # pid 999999: beyond pid_max's default, never alive
mkdir -p /etc/netns/zrtc999999-a
"$cluster" clean
ip netns list | grep -q zrtc999999 && { echo "FAIL: clean left a stale namespace"; exit 1; }
[ -e /etc/netns/zrtc999999-a ] && { echo "FAIL: clean left a stale /etc/netns entry"; exit 1; }
check_root "clean"

echo "== hostnames and links"
out=$("$cluster" --nodes 2 --ranks-per-node 2 --timeout 60 -- hostname | sort | tr '\n' ' ')
[ "$out" = "a a b b " ] || { echo "FAIL: ranks ran on '$out', not a a b b"; exit 1; }
check_root "hostname"

echo "== the hybrid suite on 2 nodes x 2 ranks, 1 Gbit/s"
"$cluster" --nodes 2 --ranks-per-node 2 --rate 1gbit --timeout 240 -- "$hybrid" > "$work/hybrid4.log" 2>&1 ||
  { tail -40 "$work/hybrid4.log"; echo "FAIL: hybrid suite on 2 x 2"; exit 1; }
grep "PASSED" "$work/hybrid4.log"
check_root "hybrid 2 x 2"

echo "== the hybrid suite on 3 nodes x 2 ranks, 10 Gbit/s"
"$cluster" --nodes 3 --ranks-per-node 2 --rate 10gbit --timeout 240 -- "$hybrid" \
  --gtest_filter='*MatchesFlat*:*CheckpointsHold*:*Overflow*' > "$work/hybrid6.log" 2>&1 ||
  { tail -40 "$work/hybrid6.log"; echo "FAIL: hybrid suite on 3 x 2"; exit 1; }
grep "PASSED" "$work/hybrid6.log"
check_root "hybrid 3 x 2"

echo "== charlm, hybrid on 2 x 2: node b killed, restarted from disk"
args=(--steps 1500 --stage 3 --shard-group-size 2 --batch 16 --every 10 --keep-last 2 --print-every 100000)
run() { "$cluster" --nodes 2 --ranks-per-node 2 --rate 1gbit --timeout 240 -- "$charlm" "${args[@]}" "$@"; }
run --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log" 2>&1 || { tail -20 "$work/base.log"; echo "FAIL: baseline"; exit 1; }
tail -1 "$work/base.log"
killed=0
for attempt in 1 2 3; do
  [ $killed -gt 0 ] && break
  run --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.$attempt.log" 2>&1 &
  job=$!
  for _ in $(seq 1 1200); do
    [ -f "$work/run/latest" ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.1
  done
  sleep "0.$((RANDOM % 10))"
  # Node b: every charlm process in a namespace zrtc<pid>-b.
  for ns in $(ip netns list | awk '{print $1}' | grep '^zrtc[0-9]*-b$' || true); do
    for p in $(ip netns pids "$ns"); do
      if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "^$charlm "; then kill -9 "$p" && killed=$((killed + 1)); fi
    done
  done
  wait $job || true
  echo "   attempt $attempt: killed $killed rank(s) of node b ($(ls "$work/run" | tr '\n' ' '))"
  check_root "a killed job"
  rm -f "$work/run.bin"  # only a run that finishes cleanly may leave the dump
done
[ $killed -gt 0 ] || { echo "FAIL: never managed to kill node b"; exit 1; }
run --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log" 2>&1 || { tail -20 "$work/run.final.log"; echo "FAIL: restart"; exit 1; }
tail -1 "$work/run.final.log"
grep -q "resumed_from=$work/run/step-" "$work/run.final.log" || { echo "FAIL: the restart did not resume"; exit 1; }
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the restarted hybrid run differs from the uninterrupted one"; exit 1; }
echo "   final parameters identical to the uninterrupted run"

echo "== resumed on one node fewer (2 ranks, S = 1: resharded)"
cp -r "$work/base" "$work/shrink"
timeout 240 mpirun -n 2 --oversubscribe --bind-to none "$charlm" --steps 1510 --stage 3 --shard-group-size 1 --batch 16 \
  --every 4 --keep-last 2 --print-every 100000 --ckpt "$work/shrink" > "$work/shrink.log" 2>&1 ||
  { tail -20 "$work/shrink.log"; echo "FAIL: resume on 2 ranks"; exit 1; }
grep -q "saved by 4 rank(s)" "$work/shrink.log" || { tail -5 "$work/shrink.log"; echo "FAIL: did not reshard from 4 ranks"; exit 1; }
tail -1 "$work/shrink.log"
check_root "the end"
echo "PASS"
