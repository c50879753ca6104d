# prometheus: the rules file deploy/prometheus-rules.yaml, checked and
# unit-tested by promtool (Debian's prometheus package).
#
#   make prometheus-deps   install promtool when missing
#   make prometheus-test   promtool check rules, promtool test rules
.PHONY: prometheus-deps prometheus-test

PROMETHEUS_APT := prometheus

prometheus-deps:
	@missing=""; for p in $(PROMETHEUS_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

prometheus-test: prometheus-deps
	promtool check rules deploy/prometheus-rules.yaml
	cd deploy && promtool test rules prometheus-rules.test.yaml

deps: prometheus-deps
test: prometheus-test
