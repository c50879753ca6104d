# appliance: status page, JSON API, probes, metrics and systemd notify
# (./appliance, ./appliance/notify, deploy/nftgate.service).
#
#   make appliance-deps   install Debian's chromium when missing (the page test drives it)
#   make appliance-test   the package tests, browser test included
#   make appliance-page-test  the page of the real nftgate binary in a lab
#                         gateway namespace, driven in Chromium (root)
#
# The browser tests write screenshots to build/test-artifacts/appliance/ and
# build/test-artifacts/nftgate/ (or under $$NFTGATE_TEST_ARTIFACTS/) and print
# their paths with -v.
.PHONY: appliance-deps appliance-test appliance-page-test

APPLIANCE_APT := chromium

appliance-deps:
	@missing=""; for p in $(APPLIANCE_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

appliance-test: appliance-deps
	$(GO) test -race -count=1 ./appliance/...

appliance-page-test: appliance-deps
	$(GO) test -race -count=1 -run 'TestPageOfRunningGateway' -v ./e2e/

# `make deps` and `make test` prepare the browser too, so the page test runs
# (and, with CI=true, must run) wherever the whole suite runs.
deps: appliance-deps
test: appliance-deps
