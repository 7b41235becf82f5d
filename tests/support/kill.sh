# Sourced by the kill/resume scripts (tests/crash/mlp_kill_resume.sh, tests/gpt/gpt_e2e.sh).
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
  victim=$(pgrep -f "$pattern" | shuf -n 1 || true)
  if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
    echo "   killed $victim ($(ls "$root" 2>/dev/null | tr '\n' ' '))"
    return 0
  fi
  return 1
}
