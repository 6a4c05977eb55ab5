#!/usr/bin/env bash
# The crash campaign: N rounds (default 1,000) of appends, modifies, deletes and commits on
# one dataset, the writer process killed with SIGKILL at a random point of each round; after
# each, the dataset is reopened and must hold exactly the last commit that landed, every
# record byte-exact with its CRC. Then the power-cut test (node/tests/power_loss.rs) with
# N cuts. Release build; prints progress and a summary; exits non-zero at the first failure.
#
#   ops/crash-campaign.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1000}
[[ $rounds =~ ^[0-9]+$ ]] && [ "$rounds" -ge 1 ] || { echo "crash-campaign.sh: N must be a positive whole number, not '$rounds'" >&2; exit 2; }
ZR_CRASH_ROUNDS=$rounds cargo test --release -q -p zr-node --test crash -- --nocapture crash_recovers_last_commit
ZR_POWER_CUTS=$rounds ZR_POWER_SEED=$(( $(date +%s) % 1000000007 )) \
  cargo test --release -q -p zr-node --test power_loss -- --nocapture
