#!/bin/bash
# New TCP connections per second through a gateway namespace running the
# ruleset `nftgate render` prints, against the same backend addressed
# directly (docs/design/dataplane.md). Run as root from the repository:
#
#   internal/testing/lab/cmd/connrate/wall.sh VARIANT CLIENT-ADDRESSES DURATION WORKERS
#
# VARIANT: direct (no Service, no NAT), old (masquerade fully-random,
# TIME_WAIT kept), keeptw (masquerade, port kept, the endpoints' TIME_WAIT
# kept), default (masquerade, port kept, TIME_WAIT released, TCP ports by
# CPU group), nocpu (default without the CPU groups), tw2 (keeptw with
# conntrack's TIME_WAIT at 2 s, as the default sets it), answer (tw2 with
# the answer to refused SYNs: what a kernel without conntrack marks runs),
# answer120 (answer, conntrack's TIME_WAIT left at 120 s), pool4 /
# pool16 (masquerade_addresses),
# keep (keep_client_address), nots (keeptw with the TCP timestamp option
# reset on every SYN to the backend). It prints the connections, stalls (a connect
# of 1 s or more), the backend's TIME_WAIT sockets and the SYNs it refused
# on them (TcpExtPAWSTimewait), the client's SYN retransmits, and the
# gateway's conntrack counters. Namespaces are named dpm<pid>-* and
# removed on exit. WALL_BIN names a directory holding nftgate and connrate
# already built (else they are built for this run). WALL_SHARDS renders that
# many service shards (default 1) and WALL_SERVICE names the Service (default
# web, in namespace default): the kernel passes the shards' NAT chains last
# created first, so a new connection via the Service passes those up to its
# own shard, and one direct passes every shard's (docs/design/dataplane.md,
# "What a shard costs a new connection"). WALL_PIN=1 gives the gateway the
# last CPU, as a box of its own: the gateway namespace's interfaces steer
# what they receive there (RPS), the client, the backend and their
# interfaces' packets get the other CPUs. The line printed has each CPU's
# busy time over the dial (busy_ms: user, nice, system, irq, softirq).
# WALL_CAPTURE=DIR keeps the last ~1.6 GB (about two minutes at 14,000
# connections a second) of the SYNs, FINs and resets the gateway namespace
# sees in DIR/gw.pcap* (tcpdump's ring of 16 files) and stops 2 s after
# conntrack's insert_failed first grows, writing the time to DIR/clash: what
# caught the rare insertion clash (docs/design/dataplane.md, "The insertion
# clash").
set -u
SVC=${WALL_SERVICE:-web}
V=$1; N=$2; D=${3:-12s}; C=${4:-8}
B=$(mktemp -d)
trap 'rm -rf $B' EXIT
if [ -n "${WALL_BIN:-}" ]; then
  cp $WALL_BIN/nftgate $WALL_BIN/connrate $B/ || exit 1
else
  go build -o $B/nftgate ./cmd/nftgate && go build -o $B/connrate ./internal/testing/lab/cmd/connrate || exit 1
fi
mkdir $B/man
cat > $B/man/web.yaml <<YAML
apiVersion: v1
kind: Service
metadata: {name: $SVC, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
status:
  loadBalancer: {ingress: [{ip: 198.19.1.10}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: $SVC}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
  - addresses: [198.18.2.10]
    conditions: {ready: true, serving: true, terminating: false}
YAML
P=dpm$$
cl=$P-cl gw=$P-gw be=$P-be
cleanup() {
  [ -n "${MON:-}" ] && kill $MON 2>/dev/null
  [ -n "${CAP:-}" ] && kill -INT $CAP 2>/dev/null
  [ -n "${SRV:-}" ] && kill $SRV 2>/dev/null; wait 2>/dev/null
  ip netns del $cl 2>/dev/null; ip netns del $gw 2>/dev/null; ip netns del $be 2>/dev/null
  rm -rf $B
}
trap cleanup EXIT
for n in $cl $gw $be; do ip netns add $n; ip -n $n link set lo up; done
ip -n $cl link add gw type veth peer name cl netns $gw
ip -n $be link add gw type veth peer name be netns $gw
ip -n $cl link set gw up; ip -n $gw link set cl up; ip -n $gw link set be up; ip -n $be link set gw up
ip -n $gw addr add 198.18.1.1/24 dev cl; ip -n $gw addr add 198.18.2.1/24 dev be
srcs=""
for i in $(seq 2 $((N+1))); do ip -n $cl addr add 198.18.1.$i/24 dev gw; srcs="$srcs,198.18.1.$i"; done
ip -n $be addr add 198.18.2.10/24 dev gw
ip -n $cl route add default via 198.18.1.1
ip -n $be route add default via 198.18.2.1
ip netns exec $gw sysctl -qw net.ipv4.ip_forward=1
# the pool is routed to the gateway, as an announcement would make it
ip -n $be route add 198.18.3.0/24 via 198.18.2.1
R="$B/nftgate render --manifests $B/man --shards ${WALL_SHARDS:-1} --external-ip-cidr 198.19.0.0/16"
p16=""; for i in $(seq 1 16); do p16="$p16 --masquerade-address 198.18.3.$i"; done
case $V in
  old) $R --release-time-wait=false --answer-refused-syns=false | sed -e "0,/ masquerade$/s// masquerade fully-random/" > $B/r-$P.nft;;
  direct|default) $R > $B/r-$P.nft;;
  keeptw) $R --release-time-wait=false --answer-refused-syns=false > $B/r-$P.nft;;
  nocpu) $R --masquerade-ports-by-cpu=false > $B/r-$P.nft;;
  tw2) $R --release-time-wait=false --answer-refused-syns=false > $B/r-$P.nft;;
  answer|answer120) $R --release-time-wait=false > $B/r-$P.nft;;
  pool4) $R --masquerade-address 198.18.3.1 --masquerade-address 198.18.3.2 --masquerade-address 198.18.3.3 --masquerade-address 198.18.3.4 > $B/r-$P.nft;;
  pool16) $R $p16 > $B/r-$P.nft;;
  keep) $R --keep-client-address > $B/r-$P.nft;;
  nots) $R --release-time-wait=false --answer-refused-syns=false > $B/r-$P.nft
    printf 'table ip nots {\n chain forward { type filter hook forward priority 0; ip daddr 198.18.2.10 tcp flags & (syn|ack) == syn reset tcp option timestamp; }\n}\n' >> $B/r-$P.nft;;
  *) echo "unknown variant $V" >&2; exit 2;;
esac
ip netns exec $gw nft -f $B/r-$P.nft || exit 1
# nftgate sets conntrack's TIME_WAIT timeout where it releases the
# backends' TIME_WAIT (conntrack_tcp_time_wait); render does not.
case $V in old|keeptw|nots|answer120) ;; *) ip netns exec $gw sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_time_wait=2;; esac
TS=""
if [ -n "${WALL_PIN:-}" ]; then
  ncpu=$(nproc); [ $ncpu -ge 2 ] || { echo "WALL_PIN needs 2 CPUs" >&2; exit 2; }
  gwm=$(printf %x $((1 << (ncpu - 1)))); othm=$(printf %x $(((1 << (ncpu - 1)) - 1)))
  TS="taskset -c 0-$((ncpu - 2))"
  for d in cl be; do ip netns exec $gw sh -c "echo $gwm > /sys/class/net/$d/queues/rx-0/rps_cpus"; done
  for n in $cl $be; do ip netns exec $n sh -c "echo $othm > /sys/class/net/gw/queues/rx-0/rps_cpus"; done
fi
ip netns exec $be $TS $B/connrate serve -listen 0.0.0.0:8080 & SRV=$!
to=198.19.1.10:80
[ $V = direct ] && to=198.18.2.10:8080
for i in $(seq 50); do ip netns exec $be ss -tln | grep -q :8080 && break; sleep 0.1; done
ip netns exec $gw conntrack -F 2>/dev/null
if [ -n "${WALL_CAPTURE:-}" ]; then
  mkdir -p $WALL_CAPTURE
  ip netns exec $gw tcpdump -Z root -i any -n -s 96 -B 65536 -C 100 -W 16 -w $WALL_CAPTURE/gw.pcap \
    'tcp[tcpflags] & (tcp-syn|tcp-rst|tcp-fin) != 0' 2>$WALL_CAPTURE/tcpdump.log & CAP=$!
  (while kill -0 $CAP 2>/dev/null; do
    n=$(ip netns exec $gw conntrack -S 2>/dev/null | grep -o 'insert_failed=[0-9]*' | awk -F= '{s += $2} END {print s + 0}')
    if [ "${n:-0}" -gt 0 ]; then date +%T.%N > $WALL_CAPTURE/clash; sleep 2; kill -INT $CAP; break; fi
    sleep 0.5
  done) & MON=$!
fi
st0=$(grep '^cpu' /proc/stat)
res=$(ip netns exec $cl $TS $B/connrate dial -to $to -from ${srcs#,} -c $C -d $D)
st1=$(grep '^cpu' /proc/stat)
if [ -n "${CAP:-}" ]; then
  kill $MON 2>/dev/null; kill -INT $CAP 2>/dev/null; wait $CAP $MON 2>/dev/null; CAP="" MON=""
fi
busy=$(paste -d' ' <(echo "$st0") <(echo "$st1") | awk '{n = NF / 2; printf "%s%s=%d", (NR > 1 ? "," : ""), $1, 10 * ($(n+2) - $2 + $(n+3) - $3 + $(n+4) - $4 + $(n+7) - $7 + $(n+8) - $8)}')
tw=$(ip netns exec $be ss -Htan state time-wait | wc -l)
twsrc=$(ip netns exec $be ss -Htan state time-wait | awk '{print $4}' | sed 's/:[0-9]*$//' | sort -u | wc -l)
ct=$(ip netns exec $gw conntrack -S | awk '{for(i=1;i<=NF;i++) if ($i ~ /^(insert_failed|drop|early_drop|clash_resolve|search_restart)=/) {split($i,a,"="); s[a[1]]+=a[2]}} END {for (k in s) printf "%s=%d ", k, s[k]}')
ctn=$(ip netns exec $gw conntrack -C)
# what the backend sent: challenge ACKs and RSTs answering SYNs on TIME_WAIT
tws=$(ip netns exec $be nstat -az 2>/dev/null | grep -E "TW|Challenge|PAWS|OutRsts|RetransSegs"  | awk '$2>0 {printf "%s=%s ", $1, $2}')
cls=$(ip netns exec $cl nstat -az 2>/dev/null | grep -E "OutRsts|RetransSegs|TCPTimeouts|SynRetrans" | awk '$2>0 {printf "%s=%s ", $1, $2}')
echo "$V clients=$N c=$C busy_ms=$busy $res tw=$tw tw_peers=$twsrc ct_entries=$ctn $ct| be: $tws | cl: $cls"
