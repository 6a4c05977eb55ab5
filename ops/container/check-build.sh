#!/usr/bin/env bash
# Runs the Containerfile's build step as a script, as the image build would, where no
# container engine is at hand: the same cargo packages and the same installed binaries, in
# debug (cheap after `cargo test`) and into a scratch directory instead of /usr/local/bin.
set -euo pipefail
cd "$(dirname "$0")/../.."
step=$(awk '/^RUN cargo build/ { line = $0; while (line ~ /\\$/) { getline next_line; sub(/\\$/, "", line); line = line next_line } print substr(line, 5) }' ops/container/Containerfile)
if [ -z "$step" ]; then
  echo "ops/container/Containerfile has no 'RUN cargo build' step" >&2
  exit 1
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
step=${step//--release /}
step=${step//target\/release\//target\/debug\/}
step=${step//\/usr\/local\/bin\//$scratch\/}
echo "+ $step"
bash -euo pipefail -c "$step"
for binary in zr zr-node zr-router; do
  [ -x "$scratch/$binary" ] || { echo "the Containerfile's build step installed no $binary" >&2; exit 1; }
done
echo "the Containerfile's build step installs zr, zr-node and zr-router"
