#!/usr/bin/env bash
# A cluster on one machine: nodes in network namespaces of their own,
# joined by a bridge in a namespace of its own (the host's network is never
# touched), each node's link shaped in both directions and each node's
# commands pinned to its CPUs. Tests and benchmarks of several nodes share it.
#
#   netcluster.sh up NAME NODES [--rate RATE] [--delay DELAY]
#       namespaces gsnc-NAME-n0 .. gsnc-NAME-n<NODES-1>, node K at
#       10.77.0.<K+1>/24 on its eth0, the bridge in gsnc-NAME-sw; RATE (tc's
#       units, default 10gbit) shapes both directions of every node's link
#       with tbf, DELAY (default 25us) delays them with netem where the kernel
#       has it (from node to node is two links: a round trip is 4 x DELAY).
#       Prints each node's address and CPU.
#   netcluster.sh exec NAME K CMD...   CMD in node K's namespace, on its CPU
#   netcluster.sh cpus NAME K          node K's CPU (core K % C of the C we may use)
#   netcluster.sh addr K               node K's address
#   netcluster.sh down NAME            kills what runs in the namespaces, deletes them
#
# Exit status: 0; 77 (with the reason) where namespaces or tbf cannot be
# made here; 2 for a usage error; 1 when a step fails (up undoes what it made).
set -euo pipefail

usage() {
  sed -n '/^#   netcluster.sh up/,/^#   netcluster.sh down/s/^# //p' "$0" >&2
  exit 2
}
skip() { echo "netcluster: cannot make a cluster here: $*" >&2; exit 77; }
fail() { echo "netcluster: $*" >&2; exit "${2:-1}"; }

check_name() {
  [[ $1 =~ ^[a-z0-9]{1,12}$ ]] || fail "NAME must be 1 to 12 of a-z 0-9, not '$1'" 2
}
check_node() {
  if ! [[ $1 =~ ^[0-9]{1,3}$ ]] || [ "$1" -ge 250 ]; then
    fail "K must be a node number below 250, not '$1'" 2
  fi
}

addr() { echo "10.77.0.$(($1 + 1))"; }

# The CPUs this script may use, as a list, from the kernel's own list
# ("0-3,6"); node K gets the (K % C)th of the C of them.
cpus() {
  local list spans=() out=() span lo hi c
  list=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
  IFS=, read -ra spans <<<"$list"
  for span in "${spans[@]}"; do
    lo=${span%-*} hi=${span#*-}
    for ((c = lo; c <= hi; c++)); do out+=("$c"); done
  done
  echo "${out[$(($1 % ${#out[@]}))]}"
}

# This cluster's namespaces, whoever made them.
namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^gsnc-$1-(sw|n[0-9]+)\$" || true
}

down() {
  local ns pids tries
  for ns in $(namespaces "$1"); do
    # Bounded: a process that outlives SIGKILL for 5 s is left to the
    # kernel, and the name is deleted all the same.
    for ((tries = 0; tries < 50; tries++)); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$pids" ] && break
      # shellcheck disable=SC2086 # one pid a word
      kill -KILL $pids 2>/dev/null || true
      sleep 0.1
    done
    ip netns delete "$ns" 2>/dev/null || true
  done
  [ -z "$(namespaces "$1")" ] || fail "namespaces of '$1' are left: $(namespaces "$1" | xargs)"
}

# Shapes the egress of DEV in namespace NS: tbf for the rate, under netem
# for the delay when there is one. tbf's burst (256 KiB) holds a GSO
# packet whole; it is all that passes ahead of the rate (10 ms at
# 200mbit). Its queue holds 20 ms of the rate before it drops.
shape() {
  local ns=$1 dev=$2 parent=root
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 10000
    parent="parent 1:1"
  fi
  # shellcheck disable=SC2086 # $parent is "root" or "parent 1:1"
  tc -n "$ns" qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst 256kb latency 20ms
}

up() {
  local name=$1 nodes=$2 k sw ns
  shift 2
  rate=10gbit delay=25us
  local delay_asked=
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; delay_asked=1; shift 2 ;;
      *) usage ;;
    esac
  done
  if ! [[ $nodes =~ ^[0-9]{1,2}$ ]] || [ "$nodes" -lt 1 ] || [ "$nodes" -gt 64 ]; then
    fail "NODES must be 1 to 64, not '$nodes'" 2
  fi
  [ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  local c
  for c in ip tc taskset; do
    command -v "$c" >/dev/null || skip "no '$c' (scripts/setup.sh installs iproute2 and util-linux)"
  done
  [ -z "$(namespaces "$name")" ] || fail "cluster '$name' exists: netcluster.sh down $name first"

  sw=gsnc-$name-sw
  # From here on, whatever fails or stops us takes the cluster down again.
  # (A global: up's locals are gone when the trap runs.)
  made=$name
  trap 'down "$made" >/dev/null 2>&1 || true' EXIT
  trap 'exit 143' TERM INT HUP
  local err
  err=$(ip netns add "$sw" 2>&1) || skip "'ip netns add' fails: $err"
  ip -n "$sw" link set lo up
  tc -n "$sw" qdisc add dev lo root tbf rate 1gbit burst 64kb latency 1ms 2>/dev/null ||
    skip "no tbf qdisc in this kernel (CONFIG_NET_SCH_TBF)"
  tc -n "$sw" qdisc del dev lo root
  # A kernel with netem as a module loads it when tc asks for it.
  if [ "$delay" = 0 ] || [ "$delay" = 0us ]; then
    delay=
  elif ! tc -n "$sw" qdisc add dev lo root netem delay 1us 2>/dev/null; then
    [ -z "$delay_asked" ] || skip "no netem qdisc in this kernel (CONFIG_NET_SCH_NETEM) for --delay $delay"
    echo "netcluster: no netem in this kernel: links are not delayed (their own latency only)" >&2
    delay=
  else
    tc -n "$sw" qdisc del dev lo root
  fi

  ip -n "$sw" link add name br0 type bridge
  ip -n "$sw" link set br0 up
  for ((k = 0; k < nodes; k++)); do
    ns=gsnc-$name-n$k
    ip netns add "$ns"
    ip -n "$sw" link add name "p$k" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$k" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0
    shape "$sw" "p$k"
  done
  trap - EXIT TERM INT HUP
  echo "cluster $name: $nodes nodes, links $rate each way, delay ${delay:-none}"
  for ((k = 0; k < nodes; k++)); do
    echo "node $k: gsnc-$name-n$k $(addr "$k") cpu $(cpus "$k")"
  done
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  up)
    [ $# -ge 2 ] || usage
    check_name "$1"
    up "$@" ;;
  exec)
    [ $# -ge 3 ] || usage
    check_name "$1"
    check_node "$2"
    ns=gsnc-$1-n$2
    [ -e "/run/netns/$ns" ] || fail "no node $2 in cluster '$1'"
    cpu=$(cpus "$2")
    shift 2
    exec ip netns exec "$ns" taskset -c "$cpu" "$@" ;;
  cpus)
    [ $# -eq 2 ] || usage
    check_name "$1"
    check_node "$2"
    cpus "$2" ;;
  addr)
    [ $# -eq 1 ] || usage
    check_node "$1"
    addr "$1" ;;
  down)
    [ $# -eq 1 ] || usage
    check_name "$1"
    down "$1" ;;
  *) usage ;;
esac
