# lab: network-namespace test lab (./internal/testing/lab), its tests and the
# demo program (./internal/testing/lab/cmd/nftgate-demo).
#
#   make demo-build   build/nftgate-demo
#   make lab-test     the lab's own tests (need root; skip with a message otherwise)
#   make lab-demo     build both binaries and run the demo (root); Ctrl-C ends it
#
# The demo runs nftgate in the gateway namespace with the example manifests:
#   build/nftgate-demo --nftgate build/nftgate --manifests examples/manifests [-- extra nftgate flags]
.PHONY: demo-build lab-deps lab-test lab-demo

DEMO_MANIFESTS ?= $(CURDIR)/examples/manifests
# Extra flags handed to nftgate by the demo.
NFTGATE_ARGS ?=

demo-build:
	$(GO) build -o $(BUILD)/nftgate-demo ./internal/testing/lab/cmd/nftgate-demo

# Host.Command runs programs in a namespace through `ip netns exec`.
lab-deps:
	@command -v ip >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; }

lab-test: lab-deps
	$(GO) test -race -count=1 ./internal/testing/lab/...

lab-demo: build demo-build lab-deps
	$(BUILD)/nftgate-demo --nftgate $(BUILD)/nftgate --manifests $(DEMO_MANIFESTS) -- $(NFTGATE_ARGS)
