# bgp: the embedded BGP speaker (./announce/bgp), tested against BIRD 2 as
# the upstream router in a network namespace.
#
#   make bgp-deps   install Debian's bird2 when missing
#   make bgp-test   the package's tests (root: namespaces, BIRD, traffic)
.PHONY: bgp-deps bgp-test

BGP_APT := bird2

bgp-deps:
	@missing=""; for p in $(BGP_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

bgp-test: bgp-deps
	$(GO) test -race -count=1 -v ./announce/bgp/

# `make deps` and `make test` install BIRD too, so the BGP tests run in both.
deps: bgp-deps
test: bgp-deps
