# failover: the harness that kills a gateway under 1,000s of live flows
# (internal/testing/failover), with the anchor (keepalived + conntrackd
# from Debian) in the same topology.
#
#   make failover-test   the harness's tests: anchor, floor, nftgate's runs
#   make bench BENCH_FAILOVER=1   the full-size phase (bench/README.md)
.PHONY: failover-deps failover-test

FAILOVER_APT := conntrackd keepalived nftables

failover-deps:
	@missing=""; for p in $(FAILOVER_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

failover-test: failover-deps bgp-deps
	$(GO) test -race -count=1 -v ./internal/testing/failover/

deps: failover-deps
test: failover-deps
bench-deps: failover-deps
