# The flowtable's proof on the appliance: two images with the custom kernel
# (which has flowtables; the stock gokrazy kernel does not), nftgate's
# flowtable on in one and off in the other, booted one after the other in
# QEMU; iperf3 runs from a client namespace through the VM to a Service
# whose endpoint is in a second namespace.
#
#   make vmtest-flowtable   build the kernel and both images, run
#                           TestApplianceFlowtable (shows [OFFLOAD] flows,
#                           logs throughput and the VM's CPU off and on)
#                           and TestApplianceStaleResetBeforeSynAck (a
#                           backend's reset that does not acknowledge a new
#                           connection's SYN leaves it alone: the kernel
#                           patch 0002) and TestApplianceReleaseResetUntracked
#                           (the release's resets leave conntrack's invalid
#                           counter alone: the kernel patch 0003) and
#                           TestApplianceHalfClosedFINAgain (a half-closed
#                           connection whose FIN is sent again lives on
#                           through a pause: the kernel patch 0004)
#   make vmtest-flowtable NFTGATE_VMTEST_ICOUNT=shift=0,sleep=on
#                           the same with the VM's clock counting its
#                           instructions: its CPU per gigabyte is then its
#                           instructions per byte, which a loaded host
#                           does not move (README "Established flows")
#   make vmtest-conncost NFTGATE_VMTEST_ICOUNT=shift=0,sleep=on
#                           the flowtable-off image (nftgate's default
#                           configuration) and connrate from the client
#                           namespace: the VM's CPU a new TCP connection,
#                           to a Service and routed directly
#                           (TestApplianceConnectionCost)
#
# Not part of `make test`: they need `make kernel`.

VMTEST_FLOWTABLE_DIR := $(CURDIR)/internal/testing/vmtest/testdata/flowtable
VMTEST_FLOWTABLE_VARS = KERNEL=custom NETWORK=$(CURDIR)/internal/testing/vmtest/testdata/network.json \
	$(VMTEST_SECRETS) MANIFESTS=$(VMTEST_FLOWTABLE_DIR)/manifests KUBECONFIG_FILE=

.PHONY: vmtest-flowtable vmtest-flowtable-images vmtest-flowtable-deps vmtest-conncost

vmtest-flowtable-deps:
	@command -v iperf3 >/dev/null && command -v tcpdump >/dev/null && command -v nft >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 tcpdump nftables; }

vmtest-flowtable-images: kernel
	$(MAKE) --no-print-directory image $(VMTEST_FLOWTABLE_VARS) IMAGE_NAME=nftgate-vmtest-flowtable-on \
		NFTGATE_CONFIG=$(VMTEST_FLOWTABLE_DIR)/on.toml
	$(MAKE) --no-print-directory image $(VMTEST_FLOWTABLE_VARS) IMAGE_NAME=nftgate-vmtest-flowtable-off \
		NFTGATE_CONFIG=$(VMTEST_FLOWTABLE_DIR)/off.toml

# TestApplianceFlowtable is compiled only with the build tag customkernel,
# as TestApplianceVLAN is.
vmtest-flowtable: vmtest-deps vmtest-flowtable-deps vmtest-flowtable-images
	NFTGATE_VMTEST_FLOWTABLE_ON=$(BUILD)/nftgate-vmtest-flowtable-on.img \
		NFTGATE_VMTEST_FLOWTABLE_OFF=$(BUILD)/nftgate-vmtest-flowtable-off.img \
		NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
		NFTGATE_VMTEST_GOKRAZY_CERT=$(VMTEST_GOKRAZY_TLS_DIR)/cert.pem \
		$(GO) test -tags customkernel -race -count=1 -v -timeout 30m -run 'TestApplianceFlowtable|TestApplianceStaleResetBeforeSynAck|TestApplianceReleaseResetUntracked|TestApplianceHalfClosedFINAgain' ./internal/testing/vmtest/

# Longer runs (NFTGATE_VMTEST_CONNCOST_SECONDS, _ROUNDS) need a longer
# timeout: the idle run and two paths a round, plus the boot.
VMTEST_CONNCOST_TIMEOUT ?= 30m
vmtest-conncost: vmtest-deps vmtest-flowtable-images
	$(GO) build -o $(BUILD)/connrate ./internal/testing/lab/cmd/connrate
	NFTGATE_VMTEST_FLOWTABLE_OFF=$(BUILD)/nftgate-vmtest-flowtable-off.img \
		NFTGATE_VMTEST_CONNRATE=$(BUILD)/connrate \
		NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
		NFTGATE_VMTEST_GOKRAZY_CERT=$(VMTEST_GOKRAZY_TLS_DIR)/cert.pem \
		$(GO) test -tags customkernel -race -count=1 -v -timeout $(VMTEST_CONNCOST_TIMEOUT) -run 'TestApplianceConnectionCost' ./internal/testing/vmtest/
