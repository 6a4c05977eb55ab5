#!/usr/bin/env bash
# A multi-host test bed on one machine: each member (the router, node 0, node 1, ...) in a
# Linux network namespace of its own, all joined through a bridge in a hub namespace by veth
# pairs, each member's link shaped with tc (netem: delay, loss, rate; tbf: rate). Only addresses inside
# the namespaces it creates are used (10.77.0.0/24); nothing touches the host's network.
#
#   testbed.sh up NAME MEMBERS [--delay MS] [--loss PCT] [--rate RATE]
#       makes NAME-hub and NAME-0 .. NAME-(MEMBERS-1); member K has address 10.77.0.(10+K).
#       --delay is one way per link (a round trip between two members crosses two links:
#       4 x delay), --loss is per link and direction (both need the kernel's netem qdisc),
#       --rate e.g. 10gbit (tbf without netem).
#   testbed.sh exec NAME K COMMAND...   runs COMMAND inside member K's namespace
#   testbed.sh addr K                    prints member K's address
#   testbed.sh down NAME                 removes everything `up` made (also after a failure)
#
# Needs root (network namespaces and tc); says so otherwise.
set -euo pipefail

die() { echo "testbed.sh: $*" >&2; exit 1; }
addr() { echo "10.77.0.$((10 + $1))"; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (it creates network namespaces and shapes links with tc)"
  command -v ip >/dev/null || die "needs the ip command (iproute2)"
  command -v tc >/dev/null || die "needs the tc command (iproute2)"
}

# True if the kernel can add a netem qdisc (tried in a scratch namespace).
has_netem() {
  local probe="zrtb-probe-$$" ok=1
  ip netns add "$probe"
  ip -n "$probe" link set lo up
  tc -n "$probe" qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
  ip netns delete "$probe"
  return $ok
}

down() {
  local name=$1
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${name}-([0-9]+|hub)$" || true); do
    ip netns delete "$ns"
  done
}

up() {
  local name=$1 members=$2
  shift 2
  local delay=0 loss=0 rate=""
  while [ $# -gt 0 ]; do
    case $1 in
      --delay) delay=$2; shift 2 ;;
      --loss) loss=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  if { [ "$delay" != 0 ] || [ "$loss" != 0 ]; } && ! has_netem; then
    die "this kernel has no netem qdisc (sch_netem), so --delay and --loss cannot be shaped here; --rate alone uses tbf"
  fi
  [[ $members =~ ^[0-9]+$ ]] && [ "$members" -ge 1 ] && [ "$members" -le 200 ] \
    || die "MEMBERS must be 1..200, not '$members'"
  down "$name"
  trap 'down "$name"' ERR
  local hub="$name-hub"
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  ip -n "$hub" link set lo up
  for ((k = 0; k < members; k++)); do
    local ns="$name-$k"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "zrtb$$-$k" type veth peer name "zrth$$-$k"
    ip link set "zrtb$$-$k" netns "$ns"
    ip link set "zrth$$-$k" netns "$hub"
    ip -n "$ns" link set "zrtb$$-$k" name eth0
    ip -n "$ns" addr add "$(addr "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$hub" link set "zrth$$-$k" master br0
    ip -n "$hub" link set "zrth$$-$k" up
    # Shape the member's link both ways: its egress here, its ingress on the hub side.
    local shape=()
    if [ "$delay" != 0 ] || [ "$loss" != 0 ]; then
      shape=(netem delay "${delay}ms" loss "${loss}%" limit 100000)
      if [ -n "$rate" ]; then shape+=(rate "$rate"); fi
    elif [ -n "$rate" ]; then
      shape=(tbf rate "$rate" burst 1mb latency 10ms)
    fi
    if [ ${#shape[@]} -gt 0 ]; then
      tc -n "$ns" qdisc add dev eth0 root "${shape[@]}"
      tc -n "$hub" qdisc add dev "zrth$$-$k" root "${shape[@]}"
    fi
  done
  trap - ERR
}

case ${1:-} in
  up) need_root; [ $# -ge 3 ] || die "usage: up NAME MEMBERS [--delay MS] [--loss PCT] [--rate RATE]"; up "${@:2}" ;;
  down) need_root; [ $# -eq 2 ] || die "usage: down NAME"; down "$2" ;;
  exec) need_root; [ $# -ge 4 ] || die "usage: exec NAME K COMMAND..."; ns="$2-$3"; shift 3; exec ip netns exec "$ns" "$@" ;;
  addr) [ $# -eq 2 ] || die "usage: addr K"; addr "$2" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
