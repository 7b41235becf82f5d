#!/usr/bin/env bash
# zrt on emulated nodes (scripts/cluster; docs/cluster.md), checked from outside:
#   1. the root namespace is untouched: its links, addresses, routes, qdiscs and /etc/hosts are the
#      same before and after every run, and a run leaves no namespace or /etc/netns entry behind;
#   2. what a killed run leaves (a stale namespace) is cleaned by the next;
#   3. the hybrid suite on 2 nodes x 2 ranks over 1 Gbit/s links and on 3 nodes x 2 ranks (shared
#      memory inside a node, TCP between nodes);
#   4. node-kill campaigns: charlm at stage 3, hybrid (S = 2 = a node), on 2 x 2 and 3 x 2 ranks
#      (each shard's save spread over its replicas on every node): every rank of a random node other
#      than a SIGKILLed at a random moment, 12 and 10 times, each restart resuming from the newest
#      complete checkpoint, none hanging; the final parameters bit-identical to an uninterrupted run
#      of the same mesh; then each resumed on one node fewer (4 -> 2 ranks with S = 1 and 2, 6 -> 4
#      with S = 2 and 4, resharded), bit for bit the saved parameters;
#   5. the same with the memory tier on 2 x 2 (tier_campaign): node b killed and its tier memory
#      removed, 8 times, each restart from the newest surviving state (node a's live copies, or disk
#      when a flipped byte leaves a shard without a good copy), a slow rank on some restarts.
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

# A failing check exits with a run still in the background: stop it (scripts/cluster's trap removes
# its namespaces).
trap 'for j in $(jobs -p); do kill "$j" 2>/dev/null; done; wait' EXIT
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

# A node-kill campaign: charlm at stage 3, hybrid with S = 2 (a node), on NODES x 2 ranks. Again and
# again, every rank of one node other than a (chosen at random) is SIGKILLed at a random moment (in a
# step, a save, the start-up or the resume itself) and the job restarted; each restart must resume
# from the newest complete checkpoint there was (none lost), and no run may hang (scripts/cluster's
# timeout). The last run finishes and must end bit-identical to an uninterrupted run of the same mesh.
campaign() {
  local nodes=$1 want=$2 tag=kill$1
  local args=(--steps 3000 --stage 3 --shard-group-size 2 --batch 16 --every 10 --keep-last 2 --print-every 100000)
  crun() { "$cluster" --nodes "$nodes" --ranks-per-node 2 --rate 1gbit --timeout 120 -- "$charlm" "${args[@]}" "$@"; }
  echo "== charlm, hybrid on $nodes x 2: $want node kills, each restart from disk"
  crun --ckpt "$work/$tag.base" --dump "$work/$tag.base.bin" > "$work/$tag.base.log" 2>&1 ||
    { tail -20 "$work/$tag.base.log"; echo "FAIL: baseline on $nodes x 2"; exit 1; }
  local kills=0 attempts=0 resumed=0 fresh=0 newest rc job
  while [ $kills -lt "$want" ] && [ $attempts -lt $((want * 3)) ]; do
    attempts=$((attempts + 1))
    # The newest complete checkpoint now: what this restart must resume from.
    newest=$(ls -d "$work/$tag.run"/step-* 2>/dev/null | grep -v '\.tmp-\|\.dead-' | sort | tail -1 || true)
    crun --ckpt "$work/$tag.run" > "$work/$tag.run.log" 2>&1 &
    job=$!
    local node hit=0
    node=$(printf "\\$(printf %o $((98 + RANDOM % (nodes - 1))))")  # b, c, ...
    ranks_of() {  # the charlm processes in node $node's namespace
      local ns p
      for ns in $(ip netns list | awk '{print $1}' | grep "^zrtc[0-9]*-$node\$" || true); do
        for p in $(ip netns pids "$ns" 2>/dev/null); do
          if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "^$charlm "; then echo "$p"; fi
        done
      done
    }
    for _ in $(seq 1 100); do  # the node's ranks started (at most 10 s), then a random moment
      [ -n "$(ranks_of)" ] && break
      kill -0 $job 2>/dev/null || break
      sleep 0.1
    done
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    for p in $(ranks_of); do kill -9 "$p" 2>/dev/null && hit=1; done
    rc=0
    wait $job || rc=$?
    [ $rc -eq 124 ] && { tail -20 "$work/$tag.run.log"; echo "FAIL: a run hung after node $node was killed"; exit 1; }
    [ $rc -ne 0 ] && [ $hit -eq 0 ] && { tail -20 "$work/$tag.run.log"; echo "FAIL: a run failed that nothing killed"; exit 1; }
    kills=$((kills + hit))
    if [ -n "$newest" ]; then
      if grep -q "^resumed from " "$work/$tag.run.log"; then  # (a kill in the start-up comes before it)
        grep -q "^resumed from $newest " "$work/$tag.run.log" ||
          { grep "^resumed from" "$work/$tag.run.log"; echo "FAIL: did not resume from the newest complete $newest"; exit 1; }
        resumed=$((resumed + 1))
      fi
    else
      fresh=$((fresh + 1))
    fi
    [ $rc -eq 0 ] && [ $hit -eq 0 ] && { echo "   attempt $attempts: the run finished before its kill"; rm -rf "$work/$tag.run"; }
  done
  [ $kills -ge "$want" ] || { echo "FAIL: $kills of $want kills landed in $attempts attempts"; exit 1; }
  newest=$(ls -d "$work/$tag.run"/step-* 2>/dev/null | grep -v '\.tmp-\|\.dead-' | sort | tail -1 || true)
  crun --ckpt "$work/$tag.run" --dump "$work/$tag.run.bin" > "$work/$tag.final.log" 2>&1 ||
    { tail -20 "$work/$tag.final.log"; echo "FAIL: final restart on $nodes x 2"; exit 1; }
  # (every kill may have landed before the first save: then there is nothing to resume from)
  [ -z "$newest" ] || grep -q "resumed_from=$newest " "$work/$tag.final.log" || { echo "FAIL: the final restart did not resume from $newest"; exit 1; }
  cmp "$work/$tag.base.bin" "$work/$tag.run.bin" || { echo "FAIL: the restarted run on $nodes x 2 differs from the uninterrupted one"; exit 1; }
  echo "   $kills node kills in $attempts attempts, $resumed checked resumes from the newest checkpoint, 0 hangs;" \
       "final parameters identical to the uninterrupted run ($(tail -1 "$work/$tag.final.log"))"
  check_root "the $nodes x 2 campaign"
}
campaign 2 "${ZRT_CLUSTER_KILLS:-12}"
campaign 3 "${ZRT_CLUSTER_KILLS3:-10}"

# The same job with the memory tier (a snapshot every step: kills land mid-snapshot and mid-commit),
# hybrid with S = 2 = a node, so each shard's live replica is on the other node. Again and again every
# rank of node b is SIGKILLed at a random moment and node b's tier memory removed (the node is lost);
# every other time a byte of node a's rank 0 copy of the newest generation is flipped as well (shard
# 0 then has no good copy of it anywhere). On every other restart one of node b's new ranks is stopped
# for a second while the job resumes (a slow rank). Each restart must resume from exactly the newest
# state that survives: the newest generation in node a's copies (node b's ranks served from them,
# "restored from its peer's replica") or the newest disk checkpoint when that is newer; after a flip,
# something older than the flipped generation and no older than the newest disk checkpoint, the same
# on every rank. The final parameters must equal the uninterrupted run's.
tier_campaign() {
  local want=$1 tag=tier shm="$work/tier.shm" node=b
  local args=(--steps 3000 --stage 3 --shard-group-size 2 --batch 16 --every 10 --keep-last 2 --print-every 100000
              --memory-every 1 --memory-dir "$shm" --ranks-per-node 2)
  crun() { "$cluster" --nodes 2 --ranks-per-node 2 --rate 1gbit --timeout 120 -- "$charlm" "${args[@]}" "$@"; }
  steps_in() { ls "$1" 2>/dev/null | grep '^step-[0-9]*$' | sed 's/^step-0*//' | sort -n || true; }
  echo "== charlm, hybrid on 2 x 2 with the memory tier: $want node kills, restarts from the other node's live copies"
  rm -rf "$shm" "$work/$tag.run"; mkdir -p "$shm"
  local kills=0 attempts=0 peer=0 below=0 slowed=0 checked=0 fell=0 exact="" floor=0 bad="" bad_sum="" rc job hit got td gen disk data
  while [ $kills -lt "$want" ] && [ $attempts -lt $((want * 3)) ]; do
    attempts=$((attempts + 1))
    crun --ckpt "$work/$tag.run" > "$work/$tag.run.log" 2>&1 &
    job=$!
    for _ in $(seq 1 100); do
      [ -n "$(ranks_of)" ] && break
      kill -0 $job 2>/dev/null || break
      sleep 0.1
    done
    if [ -n "$exact$floor" ] && [ $((attempts % 2)) -eq 0 ]; then  # a slow rank on the node that restores
      local slow
      slow=$(ranks_of | head -1 || true)
      if [ -n "$slow" ] && kill -STOP "$slow" 2>/dev/null; then sleep 1; kill -CONT "$slow"; slowed=$((slowed + 1)); fi
    fi
    sleep "$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))"  # in the start-up, the resume or the steps after it
    hit=0
    for p in $(ranks_of); do kill -9 "$p" 2>/dev/null && hit=1; done
    rc=0
    wait $job || rc=$?
    [ $rc -eq 124 ] && { tail -20 "$work/$tag.run.log"; echo "FAIL: a run with the tier hung after node b was killed"; exit 1; }
    [ $rc -ne 0 ] && [ $hit -eq 0 ] && { tail -20 "$work/$tag.run.log"; echo "FAIL: a run with the tier failed that nothing killed"; exit 1; }
    if grep -q "^resumed from " "$work/$tag.run.log"; then
      got=$(sed -n 's/^resumed from .*: step \([0-9]*\), .*/\1/p' "$work/$tag.run.log")
      [ -n "$exact" ] && checked=$((checked + 1))
      [ -z "$exact" ] && [ "$floor" -gt 0 ] && fell=$((fell + 1))
      if [ -n "$exact" ] && [ "$got" != "$exact" ]; then
        grep "^resumed from\|peer's replica\|skipped" "$work/$tag.run.log"; echo "FAIL: resumed from step $got, the newest surviving state is $exact"; exit 1
      fi
      if [ -z "$exact" ] && [ "$floor" -gt 0 ] && { [ "$got" -ge "$below" ] || [ "$got" -lt "$floor" ]; }; then
        grep "^resumed from\|skipped" "$work/$tag.run.log"; echo "FAIL: resumed from step $got after generation $below was lost (disk: $floor)"; exit 1
      fi
      grep -q "^resumed from .*(memory)" "$work/$tag.run.log" && [ "$(grep -c "restored from its peer's replica" "$work/$tag.run.log")" -eq 2 ] &&
        peer=$((peer + 1))
    fi
    kills=$((kills + hit))
    exact=""; floor=0
    if [ $hit -eq 0 ]; then
      [ $rc -eq 0 ] && { echo "   attempt $attempts: the run finished before its kill"; rm -rf "$work/$tag.run" "$shm"; mkdir -p "$shm"; }
      continue
    fi
    # Node b is lost with its memory. What survives: node a's copies and the disk.
    td=$(ls -d "$shm"/zrt-tier-* 2>/dev/null | head -1 || true)
    disk=$(ls -d "$work/$tag.run"/step-* 2>/dev/null | grep -v '\.tmp-\|\.dead-' | sed 's/.*step-0*//' | sort -n | tail -1 || true)
    gen=""
    if [ -n "$td" ]; then
      rm -rf "$td/rank-00002" "$td/rank-00003"
      for g in $(comm -12 <(steps_in "$td/rank-00000/own" | sort) <(steps_in "$td/rank-00001/own" | sort) | sort -rn); do
        # (a flipped copy still there from before is no surviving state)
        data=$(ls "$td/rank-00000/own/step-$(printf %08d "$g")"/*.data 2>/dev/null | head -1 || true)
        [ "$data" = "$bad" ] && [ "$(md5sum < "$data")" = "$bad_sum" ] && continue
        gen=$g; break
      done
    fi
    if [ -n "$gen" ] && [ $((kills % 2)) -eq 0 ] && [ "$gen" -gt "${disk:-0}" ]; then
      bad=$(ls "$td/rank-00000/own/step-$(printf %08d "$gen")"/*.data | head -1 || true)
      printf '\x5a' | dd of="$bad" bs=1 seek=4196 conv=notrunc status=none
      bad_sum=$(md5sum < "$bad"); below=$gen; floor=${disk:-0}
      [ "$floor" -gt 0 ] || floor=1  # (no disk checkpoint yet: an older generation or a fresh start)
    else
      exact=$gen
      [ -z "$exact" ] || { [ -n "$disk" ] && [ "$disk" -gt "$exact" ]; } && exact=$disk
    fi
  done
  [ $kills -ge "$want" ] || { echo "FAIL: $kills of $want kills landed in $attempts attempts"; exit 1; }
  crun --ckpt "$work/$tag.run" --dump "$work/$tag.run.bin" > "$work/$tag.final.log" 2>&1 ||
    { tail -20 "$work/$tag.final.log"; echo "FAIL: final restart with the tier"; exit 1; }
  cmp "$work/kill2.base.bin" "$work/$tag.run.bin" || { echo "FAIL: the restarted run with the tier differs from the uninterrupted one"; exit 1; }
  [ $peer -ge 1 ] || { echo "FAIL: no restart restored node b from the other node's copies"; exit 1; }
  echo "   $kills node kills in $attempts attempts; $checked restarts checked to resume from exactly the newest surviving state," \
       "$fell after a flipped byte, each from an older state; $peer restored node b from node a's copies;" \
       "$slowed with a slow rank; 0 hangs; final parameters identical to the uninterrupted run"
  check_root "the tier campaign"
}
tier_campaign "${ZRT_CLUSTER_TIER_KILLS:-8}"

# One node fewer: the last checkpoint (step 3000) of the 2 x 2 run loaded on 2 ranks with S = 1 (each
# rank a replica) and S = 2 (the state sharded over both), and of the 3 x 2 run on 4 ranks with S = 2
# and S = 4, resharded: with nothing left to train, the parameters must be bit for bit the
# uninterrupted run's; then the 2-rank S = 1 run trains on.
for shrink in "kill2 2 1" "kill2 2 2" "kill3 4 2" "kill3 4 4"; do
  read -r from n1 s1 <<< "$shrink"
  echo "== the $from run resumed on one node fewer ($n1 ranks, S = $s1: resharded)"
  rm -rf "$work/shrink$n1$s1"; cp -r "$work/$from.base" "$work/shrink$n1$s1"
  shrunk=(--stage 3 --shard-group-size "$s1" --batch 16 --every 4 --keep-last 2 --print-every 100000 --ckpt "$work/shrink$n1$s1")
  timeout 240 mpirun -n "$n1" --oversubscribe --bind-to none "$charlm" --steps 3000 "${shrunk[@]}" --dump "$work/shrink$n1$s1.bin" \
    > "$work/shrink$n1$s1.log" 2>&1 || { tail -20 "$work/shrink$n1$s1.log"; echo "FAIL: resume on $n1 ranks, S = $s1"; exit 1; }
  grep -q "saved by $((n1 + 2)) rank(s)" "$work/shrink$n1$s1.log" || { tail -5 "$work/shrink$n1$s1.log"; echo "FAIL: did not reshard"; exit 1; }
  cmp "$work/$from.base.bin" "$work/shrink$n1$s1.bin" || { echo "FAIL: the state resharded to $n1 ranks, S = $s1, differs from the saved one"; exit 1; }
  echo "   the $((n1 + 2))-rank state loaded on $n1 ranks bit for bit"
done
timeout 240 mpirun -n 2 --oversubscribe --bind-to none "$charlm" --steps 3010 --stage 3 --shard-group-size 1 --batch 16 --every 4 \
  --keep-last 2 --print-every 100000 --ckpt "$work/shrink21" > "$work/shrink.log" 2>&1 ||
  { tail -20 "$work/shrink.log"; echo "FAIL: training on after the resume on 2 ranks"; exit 1; }
tail -1 "$work/shrink.log"
check_root "the end"
echo "PASS"
