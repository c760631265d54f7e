#!/bin/bash
# tunneld against kernel WireGuard (issue 29), run by `cargo xtask kernel-wg` inside a QEMU
# guest booted with Debian's kernel (or on the host itself when its kernel has WireGuard):
#
#   kernel_wg.sh TUNNELD_BINARY
#
# Two network namespaces made here, joined by a veth: A runs tunneld (`tunneld up`, a TOML
# config), B a kernel WireGuard interface set up with `ip` and `wg set`. Underlay
# 192.0.2.0/24 and 2001:db8::/64; inside the tunnel 10.99.0.0/24 and fd99::/64; one
# preshared key. Part 1: tunneld initiates over the IPv4 underlay (the kernel side knows no
# endpoint); part 2: the kernel initiates over the IPv6 underlay (tunneld knows none). Each
# part pings both ways over IPv4 and IPv6, sends TCP both ways (checked by size and
# SHA-256), shows a rekey by restarting the initiating side (the other side's latest
# handshake moves, traffic goes on), and runs `wg show` on both sides. No kernel timer is
# shortened. Prints one `check: NAME: ok` line per check passed; stops at the first
# failure with `check: NAME: FAILED: WHY` and the logs, exit status 1. Every wait is bounded
# in count and time. Removes its namespaces, processes and files on exit, also on failure.
set -u
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  sed -n 2,17p "$0" >&2
  exit 2
fi
TUNNELD=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
TCP_HELPER="$HERE/kwg_tcp.py"
PYTHON=$(command -v python3) || { echo "kernel-wg: no python3 on PATH" >&2; exit 1; }
export PATH="$PATH:/usr/sbin:/sbin"

ID=$(( $$ % 100000 ))
A=kwga$ID; B=kwgb$ID                  # namespaces: A runs tunneld, B kernel WireGuard
TIF=kwgt$ID; KIF=kwgk$ID              # the two WireGuard interfaces
SOCK=/var/run/wireguard/$TIF.sock
W=$(mktemp -d /tmp/kernel-wg.XXXXXX) || exit 1
TPID=""
PASSED=0
STARTED=$(date +%s)

stop_tunneld() {
  [ -n "$TPID" ] || return 0
  kill -TERM "$TPID" 2>/dev/null
  for _ in $(seq 100); do
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$TPID" 2>/dev/null
  wait "$TPID" 2>/dev/null
  TPID=""
}

cleanup() {
  stop_tunneld
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  rm -f "$SOCK"
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ok NAME [DETAIL]: `check: NAME: ok (DETAIL) [S s]`, S the seconds since the script began.
ok() {
  PASSED=$((PASSED + 1))
  echo "check: $1: ok${2:+ ($2)} [$(( $(date +%s) - STARTED )) s]"
}

fail() {
  echo "check: $1: FAILED: $2"
  if ip netns exec "$B" true 2>/dev/null; then
    echo "--- wg show (tunneld, namespace A)"
    ip netns exec "$A" wg show "$TIF" 2>&1
    echo "--- wg show (kernel, namespace B)"
    ip netns exec "$B" wg show "$KIF" 2>&1
  fi
  if [ -s "$W/tunneld.log" ]; then
    echo "--- tunneld's log, last lines"
    tail -n 30 "$W/tunneld.log"
  fi
  echo "kernel-wg: $PASSED checks passed, then one failed"
  exit 1
}

# A command that must work (set-up steps): its error output goes into the failure line.
must() {
  local out
  out=$("$@" 2>&1) || fail "set-up" "$* -> $(echo "$out" | tail -n 1)"
}

inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }

# --- the underlay ----------------------------------------------------------------------
# Modules where they are modules (the guest's Debian kernel); built in, or already loaded,
# elsewhere. What is still missing then fails below with the command that needed it.
modprobe -q wireguard 2>/dev/null
modprobe -q tun 2>/dev/null             # /dev/net/tun, for tunneld
must ip netns add "$A"
must ip netns add "$B"
must ip link add vkwg netns "$A" type veth peer name vkwg netns "$B"
must ip -n "$A" addr add 192.0.2.1/24 dev vkwg
must ip -n "$B" addr add 192.0.2.2/24 dev vkwg
must ip -n "$A" -6 addr add 2001:db8::1/64 dev vkwg nodad
must ip -n "$B" -6 addr add 2001:db8::2/64 dev vkwg nodad
for ns in "$A" "$B"; do
  must ip -n "$ns" link set lo up
  must ip -n "$ns" link set vkwg up
done

# --- keys ------------------------------------------------------------------------------
umask 077
wg genkey > "$W/a.key" && wg genkey > "$W/b.key" && wg genpsk > "$W/psk" && wg genpsk > "$W/wrong.psk" \
  || fail "set-up" "wg genkey failed"
A_PUB=$(wg pubkey < "$W/a.key"); B_PUB=$(wg pubkey < "$W/b.key")
# tunneld's own key derivation must agree with wg's.
[ "$("$TUNNELD" pubkey < "$W/a.key")" = "$A_PUB" ] || fail "set-up" "tunneld pubkey differs from wg pubkey"
umask 022

# --- the two sides ---------------------------------------------------------------------

# start_tunneld [ENDPOINT]: tunneld in A; with ENDPOINT it can initiate, without it answers only.
start_tunneld() {
  local endpoint_line=""
  [ -n "${1:-}" ] && endpoint_line="endpoint = \"$1\""
  cat > "$W/a.toml" <<EOF
[interface]
name = "$TIF"
private_key_file = "$W/a.key"
listen_port = 51820
address = ["10.99.0.1/24", "fd99::1/64"]
mtu = 1420

[[peer]]
public_key = "$B_PUB"
preshared_key_file = "$W/psk"
$endpoint_line
allowed_ips = ["10.99.0.2/32", "fd99::2/128"]
EOF
  echo "=== tunneld up (endpoint: ${1:-none})" >> "$W/tunneld.log"
  ip netns exec "$A" "$TUNNELD" up "$W/a.toml" >> "$W/tunneld.log" 2>&1 &
  TPID=$!
  for _ in $(seq 120); do
    kill -0 "$TPID" 2>/dev/null || fail "tunneld starts" "it exited"
    if [ -S "$SOCK" ] && inA wg show "$TIF" >/dev/null 2>&1 \
      && inA ip -o addr show dev "$TIF" 2>/dev/null | grep -q "10.99.0.1/"; then
      return 0
    fi
    sleep 0.5
  done
  fail "tunneld starts" "no UAPI socket and address within 60 s"
}

# kernel_up PSK_FILE [ENDPOINT]: a fresh kernel WireGuard interface in B.
kernel_up() {
  local endpoint=()
  [ -n "${2:-}" ] && endpoint=(endpoint "$2")
  must ip -n "$B" link add "$KIF" type wireguard
  must ip netns exec "$B" wg set "$KIF" private-key "$W/b.key" listen-port 51820 \
    peer "$A_PUB" preshared-key "$1" allowed-ips 10.99.0.1/32,fd99::1/128 "${endpoint[@]}"
  must ip -n "$B" addr add 10.99.0.2/24 dev "$KIF"
  must ip -n "$B" -6 addr add fd99::2/64 dev "$KIF" nodad
  must ip -n "$B" link set "$KIF" mtu 1420 up
}

kernel_down() { ip -n "$B" link del "$KIF" 2>/dev/null; }

# --- what is checked -------------------------------------------------------------------

# first_ping NS ADDR: the packet that starts a handshake; retried, at most about 40 s.
first_ping() {
  local ns=$1 addr=$2
  for _ in $(seq 8); do
    ip netns exec "$ns" ping -c 1 -W 5 "$addr" >/dev/null 2>&1 && return 0
  done
  return 1
}

ping_both_ways() {
  local family out
  for family in 4 6; do
    local a_addr=10.99.0.1 b_addr=10.99.0.2
    [ $family = 6 ] && a_addr=fd99::1 && b_addr=fd99::2
    out=$(inA ping -c 3 -i 0.3 -W 5 "$b_addr" 2>&1) \
      || fail "$1: ping IPv$family tunneld -> kernel" "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
    out=$(inB ping -c 3 -i 0.3 -W 5 "$a_addr" 2>&1) \
      || fail "$1: ping IPv$family kernel -> tunneld" "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
    ok "$1: ping IPv$family both ways"
  done
}

# tcp NAME FROM_NS TO_NS TO_ADDR KIB: KIB KiB of random bytes over TCP, size and SHA-256
# compared with what arrived.
TCP_PORT=5200
tcp() {
  local name=$1 from=$2 to=$3 addr=$4 kib=$5
  TCP_PORT=$((TCP_PORT + 1))
  local data="$W/data.$TCP_PORT" ready="$W/ready.$TCP_PORT" result="$W/result.$TCP_PORT"
  head -c $((kib * 1024)) /dev/urandom > "$data"
  local want
  want="$(stat -c %s "$data") $(sha256sum "$data" | cut -d ' ' -f 1)"
  ip netns exec "$to" timeout 150 "$PYTHON" "$TCP_HELPER" serve "$TCP_PORT" "$ready" "$result" \
    2> "$W/serve.err" &
  local server=$!
  for _ in $(seq 100); do
    [ -e "$ready" ] && break
    sleep 0.2
  done
  [ -e "$ready" ] || { kill "$server" 2>/dev/null; fail "$name" "the receiver did not listen within 20 s"; }
  local t0 t1 err
  t0=$(date +%s.%N)
  if ! err=$(ip netns exec "$from" timeout 120 "$PYTHON" "$TCP_HELPER" send "$addr" "$TCP_PORT" "$data" 2>&1); then
    kill "$server" 2>/dev/null
    fail "$name" "sending failed: $err"
  fi
  t1=$(date +%s.%N)
  wait "$server" || fail "$name" "the receiver failed: $(tail -n 1 "$W/serve.err")"
  local got
  got=$(cat "$result" 2>/dev/null)
  [ "$got" = "$want" ] || fail "$name" "sent \"$want\", received \"$got\""
  ok "$name" "$kib KiB, SHA-256 equal, $(awk -v a="$t0" -v b="$t1" -v k="$kib" \
    'BEGIN { s = b - a; printf "%.1f s, %.1f Mbit/s", s, k * 8192 / 1e6 / (s > 0 ? s : 1) }')"
  rm -f "$data"
}

# handshake_time NS IFACE: the peer's latest handshake (Unix seconds; 0 for none).
handshake_time() {
  ip netns exec "$1" wg show "$2" latest-handshakes 2>/dev/null | awk 'NR == 1 { print $2 + 0 }'
}

# show_both NAME: `wg show` on both sides, printed; each must name the peer, a handshake,
# transfer counters and the preshared key (hidden), and both must hold the same key.
show_both() {
  local side ns iface peer out
  for side in tunneld kernel; do
    if [ $side = tunneld ]; then ns=$A; iface=$TIF; peer=$B_PUB; else ns=$B; iface=$KIF; peer=$A_PUB; fi
    out=$(ip netns exec "$ns" wg show "$iface" 2>&1) || fail "$1: wg show ($side)" "$out"
    echo "$out" | sed "s/^/    [$side] /"
    for want in "peer: $peer" "latest handshake:" "transfer:" "preshared key: (hidden)"; do
      echo "$out" | grep -qF "$want" || fail "$1: wg show ($side)" "no \"$want\" in its output"
    done
    [ "$(ip netns exec "$ns" wg show "$iface" preshared-keys | cut -f 2)" = "$(cat "$W/psk")" ] \
      || fail "$1: wg show ($side)" "its preshared key is not the one set"
  done
  ok "$1: wg show on both sides"
}

# ========================================================================================
echo "kernel-wg: kernel $(uname -r), $(wg --version 2>/dev/null | head -n 1), tunneld $("$TUNNELD" --version 2>/dev/null)"

# --- part 1: tunneld initiates, IPv4 underlay --------------------------------------------
P="tunneld initiates"
start_tunneld 192.0.2.2:51820
kernel_up "$W/psk"
first_ping "$A" 10.99.0.2 || fail "$P: handshake" "no reply from the kernel side within 40 s"
endpoint=$(inB wg show "$KIF" endpoints | cut -f 2)
[ "$endpoint" = "192.0.2.1:51820" ] || fail "$P: handshake" "the kernel side's endpoint for tunneld is \"$endpoint\""
ok "$P: handshake over the IPv4 underlay" "the kernel learned tunneld's endpoint $endpoint"
ping_both_ways "$P"
tcp "$P: TCP tunneld -> kernel over IPv4" "$A" "$B" 10.99.0.2 2048
tcp "$P: TCP kernel -> tunneld over IPv6" "$B" "$A" fd99::1 2048
show_both "$P"

# Rekey: a restarted tunneld has no session and starts a new handshake with the running
# kernel interface, which must take it (a newer timestamp) and carry traffic on.
before=$(handshake_time "$B" "$KIF")
sleep 1.5
stop_tunneld
start_tunneld 192.0.2.2:51820
first_ping "$A" 10.99.0.2 || fail "$P: rekey after tunneld restarts" "no reply within 40 s"
after=$(handshake_time "$B" "$KIF")
[ "$after" -gt "$before" ] || fail "$P: rekey after tunneld restarts" "the kernel's latest handshake stayed at $before"
ok "$P: rekey after tunneld restarts" "the kernel's latest handshake moved on $((after - before)) s"
ping_both_ways "$P, after the rekey"
tcp "$P, after the rekey: TCP kernel -> tunneld over IPv4" "$B" "$A" 10.99.0.1 1024
show_both "$P, after the rekey"

# --- part 2: the kernel initiates, IPv6 underlay -----------------------------------------
P="kernel initiates"
stop_tunneld
kernel_down
start_tunneld                                  # no endpoint: tunneld only answers
# First with a preshared key that differs from tunneld's: no session may come of it.
kernel_up "$W/wrong.psk" "[2001:db8::1]:51820"
for _ in 1 2; do
  inB ping -c 1 -W 3 10.99.0.1 >/dev/null 2>&1 \
    && fail "$P: a wrong preshared key" "a ping crossed with different preshared keys"
done
ok "$P: a wrong preshared key carries nothing"
must ip netns exec "$B" wg set "$KIF" peer "$A_PUB" preshared-key "$W/psk"
# The kernel retries its initiation every 5 s (REKEY_TIMEOUT), now with the right key.
first_ping "$B" 10.99.0.1 || fail "$P: handshake" "no reply from tunneld within 40 s"
endpoint=$(inA wg show "$TIF" endpoints | cut -f 2)
[ "$endpoint" = "[2001:db8::2]:51820" ] || fail "$P: handshake" "tunneld's endpoint for the kernel side is \"$endpoint\""
ok "$P: handshake over the IPv6 underlay" "tunneld learned the kernel's endpoint $endpoint"
ping_both_ways "$P"
tcp "$P: TCP kernel -> tunneld over IPv4" "$B" "$A" 10.99.0.1 2048
tcp "$P: TCP tunneld -> kernel over IPv6" "$A" "$B" fd99::2 2048
show_both "$P"

# Rekey: a fresh kernel interface (same keys) starts a new handshake with the running
# tunneld, which must replace its session and carry traffic on.
before=$(handshake_time "$A" "$TIF")
sleep 1.5
kernel_down
kernel_up "$W/psk" "[2001:db8::1]:51820"
first_ping "$B" 10.99.0.1 || fail "$P: rekey after the kernel side restarts" "no reply within 40 s"
after=$(handshake_time "$A" "$TIF")
[ "$after" -gt "$before" ] || fail "$P: rekey after the kernel side restarts" "tunneld's latest handshake stayed at $before"
ok "$P: rekey after the kernel side restarts" "tunneld's latest handshake moved on $((after - before)) s"
ping_both_ways "$P, after the rekey"
tcp "$P, after the rekey: TCP tunneld -> kernel over IPv4" "$A" "$B" 10.99.0.2 1024
show_both "$P, after the rekey"

kill -0 "$TPID" 2>/dev/null || fail "tunneld still runs" "it exited"
grep -qi "panick" "$W/tunneld.log" && fail "tunneld's log" "it holds a panic"
ok "tunneld ran without a panic"
# What tunneld chose here (workers, offloads, backend, AEAD), for the record.
grep -m 3 -E "interface up|dataplane backend|data-message AEAD" "$W/tunneld.log" | sed 's/^[^ ]* *INFO /tunneld: /'
echo "kernel-wg: $PASSED checks passed in $(( $(date +%s) - STARTED )) s"
