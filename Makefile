# nftgate build, run and test entry points.
# Each room of the project keeps its own targets in mk/<room>.mk; this file
# holds only what every room shares.
SHELL := /bin/bash
GO ?= go
BUILD := $(CURDIR)/build
export GOFLAGS := -buildvcs=false

.PHONY: all build test run deps check
all: build

# Debian packages the tests and the lab need. Installed only when missing, so
# a second run costs nothing.
APT_PACKAGES := nftables conntrack iproute2 etcd-server procps git
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(GO) mod download

build:
	$(GO) build -o $(BUILD)/nftgate ./cmd/nftgate

# The main job: the gateway on the bundled example manifests, inside a
# throwaway lab of network namespaces with demo backends (needs root).
# KUBECONFIG=path serves that cluster instead. Ctrl-C removes everything.
run: deps build demo-build
ifdef KUBECONFIG
	$(BUILD)/nftgate --kubeconfig $(KUBECONFIG) --listen 127.0.0.1:9180 $(NFTGATE_ARGS)
else
	$(BUILD)/nftgate-demo --nftgate $(BUILD)/nftgate --manifests $(CURDIR)/examples/manifests -- $(NFTGATE_ARGS)
endif

# Static checks that every change must pass. vet compiles every dependency
# first; with -race it compiles them as `go test -race` does (the project has
# no file behind a race build tag, so the same files are vetted), and the test
# run finds them in the build cache: on a cold cache each is compiled once,
# not twice.
check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet -race ./...

# Every test, as root: real nftables, conntrack, network namespaces, a real
# kube-apiserver and etcd, headless Chromium and a QEMU boot of the image.
test: deps check vmtest-deps vmtest-image
	NFTGATE_VMTEST_IMAGE=$(VMTEST_IMAGE) NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		$(GO) test -race -count=1 -timeout 40m ./...

-include mk/*.mk
