#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each, one after another, on stable
# Rust (cargo-fuzz, --sanitizer none), and prints the executions each made. Exits non-zero,
# naming the target and the input saved under fuzz/artifacts/, if any target found a crash.
#
#   fuzz/run.sh [SECONDS] [TARGET...]      default: 60 s each, every target
#   fuzz/run.sh 3600                       the long campaign: an hour each
#   ZR_FUZZ_SEED=1 fuzz/run.sh 30          libFuzzer's random seed fixed (CI: the same inputs each run)
#
# The corpora grow in fuzz/corpus/<target> and are reused by later runs.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
[[ $seconds =~ ^[0-9]+$ ]] || { echo "run.sh: SECONDS must be a whole number, not '$seconds'" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || { echo "run.sh: needs cargo-fuzz (cargo install cargo-fuzz --locked)" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
build=$(mktemp)
if ! cargo fuzz build --sanitizer none >"$build" 2>&1; then
  cat "$build" >&2
  exit 1
fi
rm -f "$build"
failed=()
printf '%-20s %14s %10s %s\n' target executions exec/s result
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  log=$(mktemp)
  # -rss_limit_mb: a target holding more than this is a finding too.
  if cargo fuzz run --sanitizer none "$target" -- -max_total_time="$seconds" -seed="${ZR_FUZZ_SEED:-0}" \
      -print_final_stats=1 -rss_limit_mb=2048 >"$log" 2>&1; then
    result=ok
  else
    result="FAILED (see below)"
    failed+=("$target")
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(( ${runs:-0} / (seconds > 0 ? seconds : 1) ))
  printf '%-20s %14s %10s %s\n' "$target" "${runs:-?}" "$rate" "$result"
  if [ "$result" != ok ]; then
    grep -E "panicked|ERROR|SUMMARY|Test unit written|artifact" "$log" | head -20 >&2 || tail -20 "$log" >&2
  fi
  rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run.sh: crashes found in: ${failed[*]}" >&2
  exit 1
fi
