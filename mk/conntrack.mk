# conntrack: stale UDP/SCTP flow cleaner.
# The tests need root (network namespaces) and the nft CLI, which only the
# tests use to program a DNAT lab; the product itself never runs nft.
.PHONY: conntrack-deps conntrack-test conntrack-bench

conntrack-deps:
	@dpkg -s nftables >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables; }

# The cleaner itself, the stale-flow computation and observer in sync/, and
# the end-to-end tests of the nftgate binary with real UDP and TCP traffic.
conntrack-test: conntrack-deps
	$(GO) test -race -count=1 ./conntrack/
	$(GO) test -race -count=1 -run 'StaleFlows|ConntrackCleaner' ./sync/
	$(GO) test -race -count=1 -run 'TestConntrack' ./e2e/

# One Clean against 1,000 and 100,000 unrelated conntrack entries, narrow
# kernel filters versus the broad per-protocol dump.
conntrack-bench: conntrack-deps
	$(GO) test -run '^$$' -bench BenchmarkClean -benchtime 20x ./conntrack/
