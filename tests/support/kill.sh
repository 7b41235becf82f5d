# Sourced by the kill/resume scripts (tests/crash/*.sh, tests/gpt/gpt_e2e.sh) and scripts/demo.
#
# rank_pids PATTERN: the rank processes whose command line matches PATTERN — never the launcher nor
# the `timeout` wrapping it (their command lines hold the same words: killing mpirun orphans the
# ranks, killing timeout orphans mpirun and returns the caller's wait at once; either way the job
# keeps running and writing the same checkpoint root as the restarted one).
rank_pids() {
  local p
  for p in $(pgrep -f "$1"); do
    case "$(ps -o comm= -p "$p" 2>/dev/null)" in
      mpirun | orterun | prterun | mpiexec | orted | prted | timeout | "") ;;
      *) echo "$p" ;;
    esac
  done
}
#
# kill_after_checkpoint ROOT PATTERN JOB: waits (up to 60 s) until a checkpoint is committed under ROOT
# or job JOB ended, sleeps a random 0-0.8 s (so kills land mid-step and mid-save), then SIGKILLs one
# random process whose command line matches PATTERN. Prints what it killed and what ROOT held; returns
# 0 if it killed one, 1 if none was left to kill.
kill_after_checkpoint() {
  local root=$1 pattern=$2 job=$3 victim
  for _ in $(seq 1 1200); do
    { [ -f "$root/latest" ] || ! kill -0 "$job" 2>/dev/null; } && break
    sleep 0.05
  done
  sleep "0.$((RANDOM % 9))"
  victim=$(rank_pids "$pattern" | shuf -n 1 || true)
  if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
    echo "   killed $victim ($(ls "$root" 2>/dev/null | tr '\n' ' '))"
    return 0
  fi
  return 1
}
