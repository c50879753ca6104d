# fuzz: Go native fuzz targets, each with a committed seed corpus under its
# package's testdata/fuzz/<target>/.
#
#   make fuzz                  every target for FUZZTIME (default 5m), in turn
#   make fuzz FUZZTIME=1h
#   make fuzz-short            every target for a count of inputs (about 10 s each
#                              on a quiet 2-core machine); part of make test
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
# The short run counts inputs, not seconds: with a duration, Go's fuzzing
# coordinator (before Go 1.27, golang/go#75804) can fail a target with
# "context deadline exceeded" when the time ends while a worker is busy, as
# it does on a loaded machine; a count has no deadline to race.
FUZZ_SHORT_COUNT_FuzzRenderManifest ?= 1500x
FUZZ_SHORT_COUNT_FuzzConfig ?= 5000x
FUZZ_SHORT_COUNT_FuzzWireMatchesGoogleNftables ?= 8000x
# Shrinking a new input is worth little in a short run and can take a minute
# per input of a few kilobytes.
FUZZ_MINIMIZE_TIME ?= 5s

# go test -fuzz takes one target of one package at a time.
# $(1): the -fuzztime of every target, or empty for each target's short count.
define fuzz-each
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		ft="$(1)"; \
		case "$$name" in \
		FuzzRenderManifest) short=$(FUZZ_SHORT_COUNT_FuzzRenderManifest);; \
		FuzzConfig) short=$(FUZZ_SHORT_COUNT_FuzzConfig);; \
		*) short=$(FUZZ_SHORT_COUNT_FuzzWireMatchesGoogleNftables);; \
		esac; \
		[ -n "$$ft" ] || ft=$$short; \
		echo "fuzz $$name ($$pkg) for $$ft"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $$ft -fuzzminimizetime $(FUZZ_MINIMIZE_TIME) $$pkg; \
	done
endef

fuzz: deps
	$(call fuzz-each,$(FUZZTIME))

fuzz-short: deps
	$(call fuzz-each,)

test: fuzz-short
