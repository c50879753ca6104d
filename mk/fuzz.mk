# fuzz: Go native fuzz targets, each with a committed seed corpus under its
# package's testdata/fuzz/<target>/.
#
#   make fuzz                  every target for FUZZTIME (default 5m), in turn
#   make fuzz FUZZTIME=1h
#   make fuzz-short            every target for FUZZ_SHORT_TIME (10s); part of make test
#
# FuzzRenderManifest  manifest file -> model -> ruleset -> `nftgate render` text:
#                     no panic, the same script every time, nft -c accepts it
#                     (in a network namespace of its own, as root)
# FuzzConfig          config file: no panic; an accepted config passes its own
#                     checks again and its canonical TOML reads back the same
# FuzzWireMatchesGoogleNftables  the netlink encoder writes what google/nftables
#                     writes, byte for byte, for any expression and Service
#
# A failing input is written to testdata/fuzz/<target>/ of its package and from
# then on runs as a seed with every `go test`: commit it with the fix.
.PHONY: fuzz fuzz-short

FUZZ_TARGETS := ./cmd/nftgate:FuzzRenderManifest ./cmd/nftgate:FuzzConfig ./nft:FuzzWireMatchesGoogleNftables
FUZZTIME ?= 5m
FUZZ_SHORT_TIME ?= 10s
# Shrinking a new input is worth little in a short run and can take a minute
# per input of a few kilobytes.
FUZZ_MINIMIZE_TIME ?= 5s

# go test -fuzz takes one target of one package at a time.
define fuzz-each
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(1)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(1) -fuzzminimizetime $(FUZZ_MINIMIZE_TIME) $$pkg; \
	done
endef

fuzz: deps
	$(call fuzz-each,$(FUZZTIME))

fuzz-short: deps
	$(call fuzz-each,$(FUZZ_SHORT_TIME))

test: fuzz-short
