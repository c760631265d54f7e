#!/bin/bash
# WireGuard over TLS against WireGuard over UDP, side by side (docs/benchmarks.md):
#
#   xtask/scripts/wg-over-tls.sh ROUNDS SECONDS LABEL=TUNNELD_BINARY:udp|tls ...
#
# Two namespaces made here, joined by a veth (192.0.2.1/2), a tunneld in each (site B also
# has `[[tls.listen]] forward_to = "wireguard"`; site A's peer uses the transport named);
# iperf3 through the tunnel for SECONDS; CPU of both tunnelds from /proc/<pid>/stat. Rows
# are interleaved round by round; one line per sample, then medians. Needs root, iperf3 and
# openssl; removes its namespaces, processes and files on exit.
set -u
if [ $# -lt 3 ]; then sed -n 2,9p "$0"; exit 2; fi
ROUNDS=$1; SECS=$2; shift 2
# Binaries as absolute paths: the script works in its own directory.
SPECS=()
for spec in "$@"; do
  rest=${spec#*=}
  SPECS+=("${spec%%=*}=$(realpath "${rest%%:*}"):${rest#*:}")
done
D=$(mktemp -d /tmp/wgtls.XXXX)
A=wgtA$$; B=wgtB$$
cleanup() { pkill -f "$D/" 2>/dev/null; sleep 0.5; ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
cd "$D"
touch samples
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -subj /CN=ca -days 2 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj /CN=bench.test 2>/dev/null
echo "subjectAltName=DNS:bench.test" > ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext 2>/dev/null
chmod 600 *.key
ip netns add $A; ip netns add $B
ip link add vA netns $A type veth peer name vB netns $B
ip -n $A addr add 192.0.2.1/24 dev vA; ip -n $B addr add 192.0.2.2/24 dev vB
for n in $A $B; do ip -n $n link set lo up; done
ip -n $A link set vA up; ip -n $B link set vB up
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for r in $(seq $ROUNDS); do
 for spec in "${SPECS[@]}"; do
  label=${spec%%=*}; rest=${spec#*=}; bin=${rest%%:*}; transport=${rest#*:}
  ka=$($bin genkey); kb=$($bin genkey)
  pa=$(echo "$ka" | $bin pubkey); pb=$(echo "$kb" | $bin pubkey)
  # site NAME KEY ADDRESS CPU PEER_KEY PEER_ADDRESS EXTRA: one site's config on stdout.
  site() {
    printf '[interface]\nname = "%s"\nprivate_key = "%s"\nlisten_port = 51820\naddress = ["%s/24"]\n' "$1" "$2" "$3"
    printf '[dataplane]\ncpus = [%s]\n[[peer]]\npublic_key = "%s"\nallowed_ips = ["%s/32"]\n%s\n' "$4" "$5" "$6" "$7"
  }
  site "wgtb$$" "$kb" 10.77.0.2 1 "$pa" 10.77.0.1 "[[tls.listen]]
listen = \"192.0.2.2:8443\"
cert_file = \"$D/server.pem\"
key_file = \"$D/server.key\"
forward_to = \"wireguard\"" > b.toml
  if [ "$transport" = tls ]; then
    peer_a="transport = \"tls\"
endpoint = \"192.0.2.2:8443\"
tls_server_name = \"bench.test\"
tls_ca_file = \"$D/ca.pem\""
  else
    peer_a="endpoint = \"192.0.2.2:51820\""
  fi
  site "wgta$$" "$ka" 10.77.0.1 0 "$pb" 10.77.0.2 "$peer_a" > a.toml
  ip netns exec $B $bin up $D/b.toml > b.log 2>&1 & PB=$!
  sleep 0.3
  ip netns exec $A $bin up $D/a.toml > a.log 2>&1 & PA=$!
  ok=0; for i in $(seq 50); do ip netns exec $A ping -c1 -W1 10.77.0.2 >/dev/null 2>&1 && { ok=1; break; }; sleep 0.2; done
  if [ $ok = 1 ]; then
   ip netns exec $B timeout $((SECS+20)) iperf3 -s -1 -B 10.77.0.2 >/dev/null 2>&1 & PS=$!
   sleep 0.3
   c0=$(( $(cpu $PA) + $(cpu $PB) ))
   out=$(ip netns exec $A timeout $((SECS+20)) iperf3 -c 10.77.0.2 -t $SECS -J 2>/dev/null)
   c1=$(( $(cpu $PA) + $(cpu $PB) ))
   bps=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null)
   hz=$(getconf CLK_TCK)
   python3 -c "b=float('${bps:-0}');c=($c1-$c0)/$hz;print(f'$label round $r: {b/1e9:.2f} Gbit/s, cpu {c:.2f} s, {b/1e9*$SECS/c if c else 0:.2f} Gbit per tunnel CPU-s')" | tee -a samples
   wait $PS 2>/dev/null
  else
   echo "$label round $r: no ping"; tail -n 5 a.log b.log
  fi
  kill $PA $PB; wait $PA $PB 2>/dev/null
 done
done
python3 - samples <<'P'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) round \d+: ([\d.]+) Gbit/s, cpu [\d.]+ s, ([\d.]+) Gbit", line)
    if m:
        rows.setdefault(m[1], []).append((float(m[2]), float(m[3])))
print("| row | TCP 1 stream | Gbit per tunnel CPU-s |\n|---|---:|---:|")
for label, samples in rows.items():
    print(f"| {label} | {statistics.median(s[0] for s in samples):.2f} Gbit/s | "
          f"{statistics.median(s[1] for s in samples):.2f} |")
P
