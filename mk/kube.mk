# Real Kubernetes control plane for tests and benchmarks: kube-apiserver and
# kube-proxy built from the k8s.io/kubernetes module (tools/k8s/build.sh), etcd
# from Debian. Package kubetest finds the binaries in $(BUILD).

# Pinned Kubernetes version. v1.37.2 (matching client-go v0.37.2) is refused by
# the module proxy here; v1.37.1 is the newest 1.37 release it serves.
KUBE_VERSION := v1.37.1
KUBE_BUILD_SCRIPT := $(CURDIR)/tools/k8s/build.sh
# Changes name when the version changes, which makes the binaries out of date.
KUBE_STAMP := $(BUILD)/.kube-version-$(KUBE_VERSION)

.PHONY: kube-apiserver kube-bin kube-deps kube-test
# The tests of every package may start a control plane (package kubetest);
# none runs kube-proxy, which only the benchmark needs (kube-bin).
test: kube-apiserver kube-deps
kube-apiserver: $(BUILD)/kube-apiserver
kube-bin: $(BUILD)/kube-apiserver $(BUILD)/kube-proxy

$(KUBE_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.kube-version-*
	@touch $@

# The script serves the binaries from a cache outside the work tree, keyed by
# version, so this rule costs a copy when another clone already built them.
# It builds only the one asked for, so that `make test` never builds
# kube-proxy.
$(BUILD)/kube-apiserver $(BUILD)/kube-proxy: $(KUBE_STAMP) $(KUBE_BUILD_SCRIPT)
	GO=$(GO) $(KUBE_BUILD_SCRIPT) -v $(KUBE_VERSION) -o $(BUILD) $(notdir $@)

# etcd for the control plane (kubetest runs /usr/bin/etcd). Installed only
# when missing.
kube-deps:
	@dpkg -s etcd-server >/dev/null 2>&1 || { \
		echo "installing: etcd-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; }

kube-test: kube-apiserver kube-deps
	$(GO) test -race ./internal/testing/kubetest/
