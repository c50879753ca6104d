# nftgate build, run and test entry points.
# Each room of the project keeps its own targets in mk/<room>.mk; this file
# holds only what every room shares.
SHELL := /bin/bash
GO ?= go
BUILD := $(CURDIR)/build
export GOFLAGS := -buildvcs=false

.PHONY: all build test run deps
all: build

# Debian packages the tests and the lab need. Installed only when missing, so
# a second run costs nothing.
APT_PACKAGES := nftables conntrack iproute2 etcd-server procps
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(GO) mod download

build:
	$(GO) build -o $(BUILD)/nftgate ./cmd/nftgate

-include mk/*.mk
