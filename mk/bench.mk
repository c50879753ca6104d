# bench: nftgate against kube-proxy (nftables and iptables modes), side by
# side on this machine, against one real kube-apiserver in one run.
#
#   make bench                          N = 1,000 and 10,000 Services x 4 endpoints
#   make bench BENCH_SIZES=1000,10000,20000   (above 20,000 loading takes long:
#                                              see "Large sizes" in bench/README.md)
#   make bench BENCH_ARGS="--changes 40"   extra flags (see bench/README.md)
#   make bench BENCH_SIZES=100000 BENCH_ARGS="--source manifests"
#                                       nftgate alone, fed from manifest files
#                                       (no kube-apiserver: see "Large sizes")
#   make bench BENCH_EDGE=10000         then the edge phase: 10,000 LoadBalancer
#                                       Services allocated by nftgate and
#                                       announced by BGP to BIRD (see "Edge")
#   make bench BENCH_FAILOVER=1         then the failover phase: 1,000 TCP + 100
#                                       UDP flows through a gateway killed with
#                                       -9: keepalived alone, keepalived +
#                                       conntrackd, nftgate (see "Failover");
#                                       BENCH_ARGS=--failover-only: that alone
#   make bench BENCH_STATESYNC=1        then the state-sync load phase: short
#                                       connections through gateway A at 1,000/s,
#                                       10,000/s and as fast as the machine goes,
#                                       the time until B's kernel holds each,
#                                       CPU with the sync on and off, a queue
#                                       overflow (see "State sync under load");
#                                       BENCH_ARGS=--statesync-load-only: that alone
#   make bench BENCH_ARGS="--dataplane-only --dataplane-duration 60s"
#                                       cold start and the data plane only: new
#                                       connections/s, stalls and iperf3, via a
#                                       Service against direct ("The data plane")
#   make bench BENCH_SIZES=10000 BENCH_ARGS="--maglev-only --changes 50"
#                                       nftgate with endpoint_selection hash and
#                                       maglev side by side, and the disruption
#                                       figures, in bench/results/maglev/ ("Maglev")
#   make bench BENCH_SIZES=10000 BENCH_ARGS="--counters-only --changes 50"
#                                       nftgate with counters on and off side by
#                                       side, data plane included, in
#                                       bench/results/counters/ ("Counters")
#   make bench BENCH_CHURN=1            then, for nftgate and kube-proxy nftables at
#                                       each size, the churn phase: EndpointSlices
#                                       rewritten at 100/s, then 1,000/s, 60 s each,
#                                       an unrelated change timed meanwhile, CPU
#                                       per write ("Under churn"); BENCH_ARGS=
#                                       --churn-only: that alone, in results/churn/
#   make bench BENCH_ARGS="--drift 9"   drift under traffic: nft flush ruleset and a
#                                       deleted map element while a client connects
#                                       every 10 ms, 9 times each (default 5; "Drift")
#
# Results (markdown table, PNG plot, raw JSON) land in bench/results/.
.PHONY: bench bench-build bench-deps

BENCH_SIZES ?= 1000,10000
BENCH_ARGS ?=
BENCH_OUT ?= $(CURDIR)/bench/results
# LoadBalancer Services of the edge phase; 0: no edge phase. It takes
# several minutes at 10,000, so it is not on by default.
BENCH_EDGE ?= 0
# 1: the failover phase after the others (bench/results/failover/).
BENCH_FAILOVER ?= 0
# 1: the state-sync load phase after the others (bench/results/statesync/).
BENCH_STATESYNC ?= 0
# 1: the churn phase after each proxier's other measurements.
BENCH_CHURN ?= 0

# kube-proxy's iptables mode needs iptables, iptables-restore and
# iptables-save; its nftables mode and the cleanup between runs need nft;
# the conntrack table is flushed between proxiers with conntrack(8); the
# data-plane phase measures bulk throughput with iperf3; the edge phase's
# router is BIRD 2.
BENCH_APT_PACKAGES := iptables nftables conntrack iproute2 etcd-server iperf3 bird2
bench-deps:
	@missing=""; for p in $(BENCH_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

bench-build:
	$(GO) build -o $(BUILD)/nftgate ./cmd/nftgate
	$(GO) build -o $(BUILD)/nftgate-bench ./bench/cmd/nftgate-bench

bench: bench-deps kube-bin bench-build
	$(BUILD)/nftgate-bench --nftgate $(BUILD)/nftgate --kube-proxy $(BUILD)/kube-proxy \
		--sizes $(BENCH_SIZES) --edge $(BENCH_EDGE) --out $(BENCH_OUT) \
		$(if $(filter 1,$(BENCH_FAILOVER)),--failover) \
		$(if $(filter 1,$(BENCH_STATESYNC)),--statesync-load) \
		$(if $(filter 1,$(BENCH_CHURN)),--churn) $(BENCH_ARGS)
