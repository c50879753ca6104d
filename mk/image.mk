# The nftgate appliance: a gokrazy image for PC x86-64, and its QEMU test.
#
#   make gok      build the pinned gok tool (build/gok), once
#   make image    build/nftgate.img (full disk image, /perm formatted)
#   make vmtest   boot an image in QEMU and check it answers
#
# Per-installation inputs (never committed):
#   NFTGATE_CONFIG   nftgate config.toml            (default: image/demo/config.toml)
#   KUBECONFIG_FILE  kubeconfig for the cluster     (default: none; nftgate reads MANIFESTS)
#   MANIFESTS        directory of manifests         (default: image/demo/manifests)
#   NETWORK          "dhcp" or a network.json file  (default: dhcp on eth0)
#   GOKRAZY_PASSWORD_FILE  web interface password   (default: build/gokrazy-password.txt, created once)
#   GOKRAZY_TLS_DIR  certificate of gokrazy's web interface and updates
#                    (default: build/gokrazy-tls/HOSTNAME_GW, made once for HOSTNAME_GW and UPDATE_HOST)
#   NFTGATE_PASSWORD_FILE  status page password (user admin) (default: build/nftgate-password.txt, created once)
#   NFTGATE_TLS_CERT, NFTGATE_TLS_KEY  status page certificate (default: none; the box makes one
#                    on its first boot and keeps it on /perm)
#   GATEWAYS_KEY_FILE  the gateway set's shared key, installed as /etc/nftgate/gateways.key
#                    when NFTGATE_CONFIG has a [gateways] section with that key_file
#                    (default: build/gateways-key.txt, created once; build every
#                    gateway of the set with the same file)
#   HOSTNAME_GW      host name of the appliance     (default: nftgate)
#   IMAGE_NAME       image and instance name        (default: nftgate -> build/nftgate.img)
#   UPDATE_HOST      where `make image-update` reaches the box (default: HOSTNAME_GW)
#   KERNEL           "stock" (github.com/gokrazy/kernel.amd64) or "custom": the
#                    kernel package of `make kernel` (mk/kernel.mk), built first
#                    when missing (default: stock)

GOK := $(BUILD)/gok
GOK_SRC := $(CURDIR)/tools/gok

# Not ./config.toml: it documents the defaults of a plain install, which
# serve this machine only.
NFTGATE_CONFIG ?= $(CURDIR)/image/demo/config.toml
KUBECONFIG_FILE ?=
MANIFESTS ?= $(CURDIR)/image/demo/manifests
NETWORK ?= dhcp
GOKRAZY_PASSWORD_FILE ?= $(BUILD)/gokrazy-password.txt
HOSTNAME_GW ?= nftgate
GOKRAZY_TLS_DIR ?= $(BUILD)/gokrazy-tls/$(HOSTNAME_GW)
NFTGATE_PASSWORD_FILE ?= $(BUILD)/nftgate-password.txt
NFTGATE_TLS_CERT ?=
NFTGATE_TLS_KEY ?=
GATEWAYS_KEY_FILE ?= $(BUILD)/gateways-key.txt
IMAGE_NAME ?= nftgate
UPDATE_HOST ?=
KERNEL ?= stock
IMAGE_KERNEL_DEPS := $(if $(filter custom,$(KERNEL)),kernel)
IMAGE_KERNEL_DIR = $(if $(filter custom,$(KERNEL)),$(KERNEL_PKG_DIR))
# 2 GiB: room for the A/B root partitions and a /perm partition for state.
IMAGE_BYTES ?= 2147483648

GOKRAZY_PARENT := $(BUILD)/gokrazy
INSTANCE_DIR := $(GOKRAZY_PARENT)/$(IMAGE_NAME)
IMAGE := $(BUILD)/$(IMAGE_NAME).img

.PHONY: gok image image-instance image-update vmtest vmtest-deps vmtest-image vmtest-update \
	vmtest-api-check vmtest-api-image vmtest-api-update

# The wrapper module has its own go.mod, so this is the only place its
# dependencies are built; go's build cache makes a second run instant.
$(GOK): $(GOK_SRC)/go.mod $(GOK_SRC)/go.sum $(GOK_SRC)/tools.go
	cd $(GOK_SRC) && $(GO) build -o $(GOK) github.com/gokrazy/tools/cmd/gok
gok: $(GOK)

# Render the instance (config.json, network.json, pinned builddir) and let
# gok add the local packages, which writes the replace directives that point
# the builddir at this checkout. The main module's go.sum goes along so the
# builddir needs no checksum lookups for what the repository already pins.
image-instance: $(GOK) $(IMAGE_KERNEL_DEPS)
	@case "$(KERNEL)" in stock|custom) ;; *) echo 'KERNEL="$(KERNEL)": want "stock" or "custom"'; exit 1;; esac
	$(GO) run ./image/cmd/mkinstance \
		-template image/config.json.tmpl -builddir image/builddir \
		-instance_dir $(INSTANCE_DIR) -hostname $(HOSTNAME_GW) -update_host "$(UPDATE_HOST)" \
		-config "$(NFTGATE_CONFIG)" -kubeconfig "$(KUBECONFIG_FILE)" \
		-manifests "$(MANIFESTS)" -network "$(NETWORK)" \
		-password_file "$(GOKRAZY_PASSWORD_FILE)" -kernel_dir "$(IMAGE_KERNEL_DIR)" \
		-nftgate_password_file "$(NFTGATE_PASSWORD_FILE)" -gokrazy_tls_dir "$(GOKRAZY_TLS_DIR)" \
		-tls_cert "$(NFTGATE_TLS_CERT)" -tls_key "$(NFTGATE_TLS_KEY)" \
		-gateways_key_file "$(GATEWAYS_KEY_FILE)"
	@for pkg in cmd/nftgate image/cmd/netconfig; do \
		$(GOK) --parent_dir $(GOKRAZY_PARENT) -i $(IMAGE_NAME) add ./$$pkg >$(INSTANCE_DIR)/add.log 2>&1 \
			|| { cat $(INSTANCE_DIR)/add.log; exit 1; }; \
		sums=$(INSTANCE_DIR)/builddir/github.com/nftgate/nftgate/$$pkg/go.sum; \
		cat go.sum $$([ -f $$sums ] && echo $$sums) | sort -u > $$sums.new && mv $$sums.new $$sums; \
	done

# gok overwrite to a file leaves /perm unformatted; it prints the mkfs.ext4
# line with the partition offset, which is run as printed.
image: image-instance
	@start=$$(date +%s.%N); \
	rm -f $(IMAGE).tmp; \
	$(GOK) --parent_dir $(GOKRAZY_PARENT) -i $(IMAGE_NAME) overwrite \
		--full $(IMAGE).tmp --target_storage_bytes=$(IMAGE_BYTES) >$(INSTANCE_DIR)/overwrite.log 2>&1 \
		|| { cat $(INSTANCE_DIR)/overwrite.log; exit 1; }; \
	mkfs_args=$$(grep -o 'mkfs.ext4 -F -E offset=[0-9]* [^ ]* [0-9]*' $(INSTANCE_DIR)/overwrite.log | sed 's/^mkfs.ext4 //'); \
	[ -n "$$mkfs_args" ] || { echo "gok did not print the mkfs.ext4 line for /perm"; cat $(INSTANCE_DIR)/overwrite.log; exit 1; }; \
	mkfs.ext4 -q $$mkfs_args || exit 1; \
	mv $(IMAGE).tmp $(IMAGE); \
	end=$$(date +%s.%N); \
	printf '%s: %s bytes apparent, %s on disk, built in %.1f s\n' $(IMAGE) \
		$$(stat -c %s $(IMAGE)) $$(du -h $(IMAGE) | cut -f1) $$(awk "BEGIN{print $$end - $$start}"); \
	cat $(INSTANCE_DIR)/access.txt

# Build and install on a running appliance over HTTPS (A/B root switch and
# reboot); the same inputs as `make image` must be given again. gok (this
# version) does not hand the certificate of Update.UseTLS to its update
# client, which then trusts only the system's CAs and the certificates in
# SSL_CERT_DIR: so the box's certificate is added there, and the update
# verifies the box as every other HTTPS connection.
# A box of several gateways drains before the update reboots it when its
# configuration has drain_on_stop = true: gokrazy sends SIGTERM and waits
# up to 100 s (README, "Several gateways and drain").
image-update: image-instance
	SSL_CERT_DIR=$(GOKRAZY_TLS_DIR) $(GOK) --parent_dir $(GOKRAZY_PARENT) -i $(IMAGE_NAME) update

# QEMU for the VM test; installed only when missing.
vmtest-deps:
	@command -v qemu-system-x86_64 >/dev/null && [ -e /usr/share/OVMF/OVMF_CODE_4M.fd ] || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 ovmf; }

# The test image: the demo image with the static two-interface network the
# test wires to its namespaces, and its own password file.
VMTEST_IMAGE := $(BUILD)/nftgate-vmtest.img
VMTEST_PASSWORD_FILE := $(BUILD)/vmtest-password.txt
VMTEST_NFTGATE_PASSWORD_FILE := $(BUILD)/vmtest-nftgate-password.txt
VMTEST_GOKRAZY_TLS_DIR := $(BUILD)/vmtest-gokrazy-tls
# The VM's address on the client side
# (internal/testing/vmtest/testdata/network.json): the test reaches gokrazy
# there, and its certificate must name it.
VMTEST_UPDATE_HOST := 10.123.1.1
VMTEST_SECRETS := GOKRAZY_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
	NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
	GOKRAZY_TLS_DIR=$(VMTEST_GOKRAZY_TLS_DIR) UPDATE_HOST=$(VMTEST_UPDATE_HOST)
VMTEST_VARS := IMAGE_NAME=nftgate-vmtest \
	NETWORK=$(CURDIR)/internal/testing/vmtest/testdata/network.json \
	$(VMTEST_SECRETS) \
	NFTGATE_CONFIG=$(CURDIR)/image/demo/config.toml \
	MANIFESTS=$(CURDIR)/image/demo/manifests KUBECONFIG_FILE=
vmtest-image:
	$(MAKE) --no-print-directory image $(VMTEST_VARS)

# Used by the VM test (run inside the namespace that reaches the VM) to
# exercise gok update; UPDATE_HOST is the VM's address.
vmtest-update:
	$(MAKE) --no-print-directory image-update $(VMTEST_VARS)

# The image of the API-backed VM test: nftgate serving a real kube-apiserver
# that the test starts in its inside namespace. The kubeconfig (address,
# CA, ServiceAccount token) exists only once that control plane runs, so
# the test builds this image itself, giving VMTEST_KUBECONFIG and
# VMTEST_CONFIG (nftgate's config.toml); vmtest-image has already built
# everything else it needs, so this build is incremental.
VMTEST_API_VARS := IMAGE_NAME=nftgate-vmtest-api \
	NETWORK=$(CURDIR)/internal/testing/vmtest/testdata/network.json \
	$(VMTEST_SECRETS) \
	NFTGATE_CONFIG=$(VMTEST_CONFIG) KUBECONFIG_FILE=$(VMTEST_KUBECONFIG) \
	MANIFESTS=$(CURDIR)/image/demo/manifests
vmtest-api-check:
	@[ -f "$(VMTEST_KUBECONFIG)" ] && [ -f "$(VMTEST_CONFIG)" ] || \
		{ echo "VMTEST_KUBECONFIG and VMTEST_CONFIG must name files (the VM test sets them)"; exit 1; }
vmtest-api-image: vmtest-api-check
	$(MAKE) --no-print-directory image $(VMTEST_API_VARS)
vmtest-api-update: vmtest-api-check
	$(MAKE) --no-print-directory image-update $(VMTEST_API_VARS)

# The API-backed test needs kube-apiserver and etcd (mk/kube.mk), and BIRD
# (mk/bgp.mk) as the upstream router the VM announces its addresses to.
vmtest: vmtest-deps vmtest-image kube-apiserver kube-deps bgp-deps
	NFTGATE_VMTEST_IMAGE=$(VMTEST_IMAGE) NFTGATE_VMTEST_PASSWORD_FILE=$(VMTEST_PASSWORD_FILE) \
		NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE=$(VMTEST_NFTGATE_PASSWORD_FILE) \
		NFTGATE_VMTEST_GOKRAZY_CERT=$(VMTEST_GOKRAZY_TLS_DIR)/cert.pem \
		$(GO) test -race -count=1 -v -timeout 15m ./internal/testing/vmtest/
