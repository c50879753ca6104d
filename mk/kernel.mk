# The nftgate kernel: the stock gokrazy amd64 configuration plus VLANs,
# numgen, ct mark/events and dummy interfaces, built from Debian's Linux
# source with the patches in image/kernel/patches (image/README.md "Custom
# kernel").
#
#   make kernel              build/kernel/pkg, a gokrazy kernel package (20-40 min
#                            on 2 cores the first time; skipped when nothing changed)
#   make image KERNEL=custom the image with that kernel instead of the stock one
#   make vmtest-vlan         build both, boot the image in QEMU, test a VLAN
#
# None of this is part of `make test`: the kernel build takes too long for it.

KERNEL_WORK ?= $(BUILD)/kernel
KERNEL_PKG_DIR ?= $(KERNEL_WORK)/pkg
# Debian series of linux-source (6.12 is what was built and tested; 6.1 is
# also in Debian, untried).
KERNEL_SOURCE_SERIES ?= 6.12
KERNEL_JOBS ?= 2
KERNEL_BUILD_PACKAGES := build-essential bc bison flex libelf-dev libssl-dev cpio kmod xz-utils \
	linux-source-$(KERNEL_SOURCE_SERIES)

.PHONY: kernel kernel-deps vmtest-vlan vmtest-vlan-image

kernel-deps:
	@missing=""; for p in $(KERNEL_BUILD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

kernel: kernel-deps
	@start=$$(date +%s); \
	KERNEL_SOURCE_SERIES=$(KERNEL_SOURCE_SERIES) KERNEL_JOBS=$(KERNEL_JOBS) \
		image/kernel/build.sh $(KERNEL_WORK) $(KERNEL_PKG_DIR) || exit 1; \
	echo "make kernel: $$(( $$(date +%s) - start )) s"

# The VLAN test image: the vmtest image's inputs with the custom kernel and
# a VLAN on eth1 (internal/testing/vmtest/testdata/network-vlan.json).
VMTEST_VLAN_IMAGE := $(BUILD)/nftgate-vmtest-vlan.img
VMTEST_VLAN_VARS := IMAGE_NAME=nftgate-vmtest-vlan KERNEL=custom \
	NETWORK=$(CURDIR)/internal/testing/vmtest/testdata/network-vlan.json \
	$(VMTEST_SECRETS) \
	NFTGATE_CONFIG=$(CURDIR)/image/demo/config.toml \
	MANIFESTS=$(CURDIR)/image/demo/manifests KUBECONFIG_FILE=
vmtest-vlan-image: kernel
	$(MAKE) --no-print-directory image $(VMTEST_VLAN_VARS)

# TestApplianceVLAN is compiled only with the build tag customkernel, so
# `make test` and `go test ./internal/testing/vmtest/` never see it (rather
# than skip it); it fails when NFTGATE_VMTEST_VLAN_IMAGE does not name the
# image.
vmtest-vlan: vmtest-deps vmtest-vlan-image
	NFTGATE_VMTEST_VLAN_IMAGE=$(VMTEST_VLAN_IMAGE) NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
		NFTGATE_VMTEST_GOKRAZY_CERT=$(VMTEST_GOKRAZY_TLS_DIR)/cert.pem \
		$(GO) test -tags customkernel -race -count=1 -v -timeout 15m -run 'TestApplianceVLAN' ./internal/testing/vmtest/
