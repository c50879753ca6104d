# ruleset and kernel: the oracle tests against google/nftables' newest
# release as well as the version go.mod pins.
#
#   make oracle-newest                 the oracle tests of ./nft with the newest
#                                      github.com/google/nftables release
#   make oracle-newest NFTABLES_VERSION=master   (or any version or commit)
#
# nftgate writes its netlink itself (nft/wire.go, nft/encode.go); the tests
# hold its bytes to google/nftables' (TestWire*, FuzzWireMatchesGoogleNftables
# on its seeds) and google/nftables' netlink to nft's (TestNetlinkMatchesNft).
# The newest release is run from a go.mod generated under build/oracle/, so
# the module's own go.mod stays as it is.
.PHONY: oracle-newest

ORACLE_DIR := $(BUILD)/oracle
NFTABLES_VERSION ?= $(lastword $(shell $(GO) list -m -versions github.com/google/nftables))
ORACLE_TESTS := ^(TestWire|FuzzWireMatchesGoogleNftables|TestNetlinkMatchesNft)

oracle-newest:
	@mkdir -p $(ORACLE_DIR)
	cp go.mod $(ORACLE_DIR)/go.mod
	cp go.sum $(ORACLE_DIR)/go.sum
	$(GO) get -modfile=$(ORACLE_DIR)/go.mod github.com/google/nftables@$(NFTABLES_VERSION)
	@echo "oracle tests against github.com/google/nftables $$($(GO) list -modfile=$(ORACLE_DIR)/go.mod -m -f '{{.Version}}' github.com/google/nftables)"
	$(GO) test -race -count=1 -timeout 10m -modfile=$(ORACLE_DIR)/go.mod -run '$(ORACLE_TESTS)' ./nft/

test: oracle-newest
