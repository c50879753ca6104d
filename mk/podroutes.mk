# podroutes: the gateway's routes to pods (./podroutes), tested in network
# namespaces with iproute2 (already in APT_PACKAGES).
#
#   make podroutes-test   the package's tests (root: namespaces, traffic)
.PHONY: podroutes-test

podroutes-test: deps
	$(GO) test -race -count=1 -v ./podroutes/
