# State sync on the appliance: two images with the custom kernel (the
# stock gokrazy kernel has no conntrack events or marks, which state sync
# needs), gw-a and gw-b of an active/backup pair, each with its own
# config.toml and network and the same manifests and gateway set key,
# booted side by side in QEMU on a client bridge and a cluster bridge.
# Long-lived TCP connections and UDP flows go through gw-a; gw-a's QEMU is
# killed with -9; they carry on through gw-b.
#
#   make vmtest-statesync   build the kernel and both images, run
#                           TestApplianceStateSync
#
# Not part of `make test`: it needs `make kernel`.

VMTEST_STATESYNC_DIR := $(CURDIR)/internal/testing/vmtest/testdata/statesync
# One key for the set: both images are built with the same file.
VMTEST_STATESYNC_KEY := $(BUILD)/vmtest-statesync-key.txt
VMTEST_STATESYNC_VARS = KERNEL=custom MANIFESTS=$(VMTEST_STATESYNC_DIR)/manifests KUBECONFIG_FILE= \
	GOKRAZY_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
	GATEWAYS_KEY_FILE=$(VMTEST_STATESYNC_KEY)

.PHONY: vmtest-statesync vmtest-statesync-images

vmtest-statesync-images: kernel
	@for gw in gw-a gw-b; do \
		$(MAKE) --no-print-directory image $(VMTEST_STATESYNC_VARS) IMAGE_NAME=nftgate-vmtest-statesync-$$gw \
			HOSTNAME_GW=$$gw GOKRAZY_TLS_DIR=$(BUILD)/vmtest-statesync-tls/$$gw \
			NFTGATE_CONFIG=$(VMTEST_STATESYNC_DIR)/$$gw.toml NETWORK=$(VMTEST_STATESYNC_DIR)/network-$$gw.json || exit 1; \
	done

# TestApplianceStateSync is compiled only with the build tag customkernel,
# as TestApplianceVLAN is; it skips when the images are not named.
vmtest-statesync: vmtest-deps vmtest-statesync-images
	NFTGATE_VMTEST_STATESYNC_A=$(BUILD)/nftgate-vmtest-statesync-gw-a.img \
		NFTGATE_VMTEST_STATESYNC_B=$(BUILD)/nftgate-vmtest-statesync-gw-b.img \
		NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
		NFTGATE_VMTEST_GOKRAZY_CERT=$(BUILD)/vmtest-statesync-tls/gw-a/cert.pem \
		$(GO) test -tags customkernel -race -count=1 -v -timeout 20m -run 'TestApplianceStateSync' ./internal/testing/vmtest/
