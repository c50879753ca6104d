package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/source"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The documented config.toml holds every key, each at its default.
func TestDocumentedConfigIsTheDefault(t *testing.T) {
	cfg, _, err := loadConfig("nftgate", []string{"--config", filepath.Join("..", "..", "config.toml"), "--node-name", "n"})
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.NodeName = "n"
	if err := want.validate(); err != nil {
		t.Fatal(err)
	}
	// An empty list in the file is the default's absent list.
	if len(cfg.ClusterCIDRs) == 0 && len(cfg.NodePortAddresses) == 0 && len(cfg.ExternalIPCIDRs) == 0 {
		cfg.ClusterCIDRs, cfg.NodePortAddresses, cfg.ExternalIPCIDRs = nil, nil, nil
	}
	if len(cfg.HTTPAllowedHosts) == 0 {
		cfg.HTTPAllowedHosts = nil
	}
	if len(cfg.FlowtableDevices) == 0 {
		cfg.FlowtableDevices = nil
	}
	if len(cfg.MasqueradeAddresses) == 0 {
		cfg.MasqueradeAddresses = nil
	}
	if !reflect.DeepEqual(cfg, &want) {
		t.Errorf("config.toml differs from the defaults:\n got %+v\nwant %+v", *cfg, want)
	}
}

func TestFlagsOverrideTheFile(t *testing.T) {
	p := writeConfig(t, "table = \"fromfile\"\ncluster_cidrs = [\"10.0.0.0/8\"]\nmin_sync_interval = \"1s\"\n")
	cfg, _, err := loadConfig("nftgate", []string{"--config", p, "--table", "fromflag", "--cluster-cidr", "10.1.0.0/16", "--cluster-cidr", "fd00::/64", "--node-name", "n"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Table != "fromflag" || time.Duration(cfg.MinSyncInterval) != time.Second {
		t.Errorf("got table %q, min_sync_interval %s", cfg.Table, cfg.MinSyncInterval)
	}
	if got := strings.Join(cfg.ClusterCIDRs, ","); got != "10.1.0.0/16,fd00::/64" {
		t.Errorf("cluster CIDRs %s: the flag must replace the file's list", got)
	}
}

// Every bad input is an error that names the key or flag and the value.
// badConfig is a configuration (a file's text, flags) that loadConfig must
// refuse with an error naming every string of want.
type badConfig struct {
	file string
	args []string
	want []string
}

// checkConfigErrors loads each case and checks its error names what it must.
func checkConfigErrors(t *testing.T, cases []badConfig) {
	t.Helper()
	for _, tc := range cases {
		args := append([]string{"--node-name", "n"}, tc.args...)
		if tc.file != "" {
			args = append(args, "--config", writeConfig(t, tc.file))
		}
		_, _, err := loadConfig("nftgate", args)
		if err == nil {
			t.Errorf("%q %v: accepted", tc.file, tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q %v: error %q does not name %q", tc.file, tc.args, err, w)
			}
		}
	}
}

// An error of a value the file gave names the file, and the flags given
// beside it (which may have set the value instead); without a file, the
// key and the value alone.
func TestBadConfigNamesTheFile(t *testing.T) {
	path := writeConfig(t, "node_name = \"n\"\nanswer_service_address_ping_rate = 0\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", path}, "config " + path + ": answer_service_address_ping_rate: 0 is not"},
		{[]string{"--config", path, "--answer-service-address-ping-rate", "200000"}, "config " + path + " with flags --answer-service-address-ping-rate: answer_service_address_ping_rate: 200000 is not"},
		{[]string{"--node-name", "n", "--answer-service-address-ping-rate", "0"}, "answer_service_address_ping_rate: 0 is not"},
	} {
		_, _, err := loadConfig("nftgate", tc.args)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to begin %q", tc.args, err, tc.want)
		}
	}
}

func TestBadConfigNamesTheField(t *testing.T) {
	checkConfigErrors(t, []badConfig{
		{file: "bogus = 1\n", want: []string{"unknown key bogus"}},
		{file: "[[pools]]\nname = \"a\"\naddresses = [\"192.0.2.0/33\"]\n", want: []string{"pools[0]", "192.0.2.0/33"}},
		{file: "[[pools]]\nname = \"a\"\naddresses = [\"192.0.2.0/28\"]\ncolour = 1\n", want: []string{"unknown key pools.colour"}},
		{file: "load_balancer_class = \"plain\"\n", want: []string{"load_balancer_class", "plain"}},
		{file: "[bgp]\nasn = 64513\nrouter_id = \"198.18.0.2\"\n[[bgp.peer]]\naddress = \"198.18.0.1\"\nasn = 64512\nhold_time = \"1s\"\n", want: []string{"bgp.peer[0].hold_time", "1s"}},
		{file: "[bgp]\nasn = 64513\nrouter_id = \"198.18.0.2\"\nholdtime = 3\n", want: []string{"unknown key bgp.holdtime"}},
		{file: "[l2]\ninterfaces = [\"eth0\", \"eth0\"]\n", want: []string{"l2.interfaces[1]", "eth0"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n[[gateways.peers]]\nname = \"gw-a\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.peers[0].name", "gw-a"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2\"]\n", want: []string{"gateways.peers[0].addresses[0]", "10.0.0.2"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nheartbeat_interval = \"1ms\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.heartbeat_interval", "1ms"}},
		{file: "[gateways]\nname = \"GW A\"\n", want: []string{"gateways.name", "GW A"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nsync_queue = 10\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.sync_queue", "10"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nsync_batch_interval = \"2s\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.sync_batch_interval", "2s"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nsync_batch_bytes = 100\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.sync_batch_bytes", "100"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nsync_refresh_interval = \"10ms\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.sync_refresh_interval", "10ms"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp = \"drop\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp", "drop", "wait", "pickup"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nstate_sync = false\nmidstream_tcp = \"wait\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp", "wait", "state_sync = true"}},
		{file: "unserved_service_traffic = \"forward\"\n", want: []string{"unserved_service_traffic", "forward", "reject", "drop", "route"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp_wait = \"500ms\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait", "500ms", "1s to 10m"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp = \"pickup\"\nmidstream_tcp_wait = \"3s\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait", "3s", "midstream_tcp = \"wait\""}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp = \"pickup\"\nmidstream_tcp_wait_peer_dead = \"1s\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait_peer_dead", "1s", "midstream_tcp = \"wait\""}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp_wait_peer_dead = \"50ms\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait_peer_dead", "50ms", "100ms", "to midstream_tcp_wait (10s;"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nsync_batch_interval = \"200ms\"\nmidstream_tcp_wait_peer_dead = \"300ms\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait_peer_dead", "300ms", "want 400ms"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmidstream_tcp_wait = \"3s\"\nmidstream_tcp_wait_peer_dead = \"4s\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.midstream_tcp_wait_peer_dead", "4s", "to midstream_tcp_wait (3s;"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nconntrack_events = \"routed\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.conntrack_events", "routed", "lean", "services", "all"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nstate_sync = false\nconntrack_events = \"services\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.conntrack_events", "services", "state_sync = true"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nstate_sync = false\nconntrack_events = \"lean\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.conntrack_events", "lean", "state_sync = true"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\ntrack_interfaces = [\"eth0\", \"eth/1\"]\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.track_interfaces[1]", "eth/1", "interface name"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\ntrack_interfaces = [\"eth0\", \"eth0\"]\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.track_interfaces[1]", "eth0", "listed twice"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\ntrack_up_after = \"-1s\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.track_up_after", "-1s", "0s to 10m"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nready_timeout = \"1h\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n", want: []string{"gateways.ready_timeout", "1h0m0s"}},
		{file: "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n[[gateways.peers]]\nname = \"gw-b\"\n", want: []string{"gateways.peers[0].addresses", "[]"}},
		{file: "min_sync_interval = \"soon\"\n", want: []string{"min_sync_interval", "soon"}},
		{file: "counters_traffic_elements = -1\n", want: []string{"counters_traffic_elements", "-1"}},
		{file: "answer_service_address_ping_rate = 0\n", want: []string{"answer_service_address_ping_rate", "0", "100000"}},
		{args: []string{"--answer-service-address-ping-source-rate", "100001"}, want: []string{"answer_service_address_ping_source_rate", "100001"}},
		{file: "answer_service_address_ping_source_rate = -3\n", want: []string{"answer_service_address_ping_source_rate", "-3"}},
		{file: "cluster_cidrs = [\"10.0.0.0/33\"]\n", want: []string{"cluster_cidrs[0]", "10.0.0.0/33"}},
		{args: []string{"--nodeport-addresses", "nonsense"}, want: []string{"nodeport_addresses[0]", "nonsense"}},
		{args: []string{"--external-ip-cidr", "198.51.100.0/24", "--external-ip-cidr", "all"}, want: []string{"external_ip_cidrs[1]", "all"}},
		{file: "external_ip_cidrs = [\"203.0.113.0/33\"]\n", want: []string{"external_ip_cidrs[0]", "203.0.113.0/33"}},
		{args: []string{"--listen", "9180"}, want: []string{"listen", "9180"}},
		{args: []string{"--log-level", "loud"}, want: []string{"log_level", "loud"}},
		{args: []string{"--log-format", "xml"}, want: []string{"log_format", "xml"}},
		{args: []string{"--table", "a b"}, want: []string{"table", "a b"}},
		{file: "masquerade_bit = 3\n", want: []string{"masquerade_bit", "0x3"}},
		{file: "conntrack_tcp_time_wait = \"500ms\"\n", want: []string{"conntrack_tcp_time_wait", "500ms"}},
		{file: "conntrack_tcp_time_wait = \"1.5s\"\n", want: []string{"conntrack_tcp_time_wait", "1.5s"}},
		{file: "conntrack_tcp_time_wait = \"10m\"\n", want: []string{"conntrack_tcp_time_wait", "10m0s"}},
		{file: "conntrack_max_per_cpu = -1\n", want: []string{"conntrack_max_per_cpu", "-1"}},
		{file: "conntrack_max_per_cpu = 8388608\n", want: []string{"conntrack_max_per_cpu", "8388608"}},
		{file: "conntrack_min = -5\n", want: []string{"conntrack_min", "-5"}},
		{args: []string{"--kubeconfig", "k", "--manifests", "d"}, want: []string{"manifests", "kubeconfig"}},
		{args: []string{"stray"}, want: []string{"unexpected argument", "stray"}},
		{args: []string{"--reconcile-interval", "-1s"}, want: []string{"reconcile_interval", "-1s"}},
		{file: "memory_limit = \"96MB\"\n", want: []string{"memory_limit", "96MB"}},
		{file: "memory_limit = \"-1MiB\"\n", want: []string{"memory_limit", "-1MiB"}},
		{args: []string{"--memory-limit", "lots"}, want: []string{"memory-limit", "lots"}},
		// Values of the right type out of their bounds.
		{file: "healthz_max_sync_age = \"-1m\"\n", want: []string{"healthz_max_sync_age", "-1m"}},
		{file: "healthz_max_sync_age = \"1ms\"\n", want: []string{"healthz_max_sync_age", "1ms"}},
		{file: "healthz_max_sync_age = \"30s\"\n", want: []string{"healthz_max_sync_age", "30s", "reconcile_interval", "1m0s"}},
		{file: "healthz_max_sync_age = \"1000h\"\n", want: []string{"healthz_max_sync_age", "1000h0m0s"}},
		{args: []string{"--reconcile-interval", "1ns"}, want: []string{"reconcile_interval", "1ns"}},
		{args: []string{"--reconcile-interval", "500ms"}, want: []string{"reconcile_interval", "500ms"}},
		{args: []string{"--reconcile-interval", "48h"}, want: []string{"reconcile_interval", "48h0m0s"}},
		{file: "min_repair_interval = \"-1s\"\n", want: []string{"min_repair_interval", "-1s"}},
		{file: "min_repair_interval = \"2h\"\n", want: []string{"min_repair_interval", "2h0m0s"}},
		{args: []string{"--min-sync-interval", "0s"}, want: []string{"min_sync_interval", "0s"}},
		{args: []string{"--min-sync-interval", "100us"}, want: []string{"min_sync_interval", "100µs"}},
		{args: []string{"--min-sync-interval", "-5ms"}, want: []string{"min_sync_interval", "-5ms"}},
		{args: []string{"--min-sync-interval", "2m"}, want: []string{"min_sync_interval", "2m0s"}},
		{file: "memory_limit = \"1B\"\n", want: []string{"memory_limit", "1", "16MiB"}},
		{args: []string{"--memory-limit", "15MiB"}, want: []string{"memory_limit", "15MiB"}},
		{args: []string{"--memory-limit", "2048GiB"}, want: []string{"memory_limit", "2048GiB"}},
		{args: []string{"--table", "filter;"}, want: []string{"table", "filter;"}},
		{args: []string{"--table", "x{"}, want: []string{"table", "x{"}},
		{args: []string{"--table", "a}\ntable ip evil {"}, want: []string{"table", `a}\ntable ip evil {`}},
		{args: []string{"--table", ""}, want: []string{"table", `""`}},
		{args: []string{"--table", "-dash"}, want: []string{"table", "-dash"}},
		{args: []string{"--table", "ünïcode"}, want: []string{"table", "ünïcode"}},
		{args: []string{"--table", strings.Repeat("t", 65)}, want: []string{"table", strings.Repeat("t", 65), "at most 64"}},
		{args: []string{"--shards", "0"}, want: []string{"shards", "0"}},
		{args: []string{"--shards", "257"}, want: []string{"shards", "257"}},
		{args: []string{"--shards", "many"}, want: []string{"shards", "many"}},
		{file: "shards = 0\n", want: []string{"shards", "0"}},
		{file: "shards = \"many\"\n", want: []string{"shards", "many"}},
		{file: "shards = 1.5\n", want: []string{"shards", "1.5"}},
		{args: []string{"--endpoint-selection", "random"}, want: []string{"endpoint_selection", "random"}},
		{args: []string{"--flowtable"}, want: []string{"flowtable_devices", "empty"}},
		{file: "flowtable_packets = -1\n", want: []string{"flowtable_packets", "-1"}},
		{args: []string{"--flowtable-packets", "4294967297"}, want: []string{"flowtable_packets", "4294967297"}},
		{file: "flowtable = true\nflowtable_devices = [\"eth0\", \"eth0/1\"]\n", want: []string{"flowtable_devices[1]", "eth0/1"}},
		{args: []string{"--flowtable", "--flowtable-device", "eth0", "--flowtable-device", "eth0"}, want: []string{"flowtable_devices[1]", "eth0", "twice"}},
		{args: []string{"--flowtable", "--flowtable-device", "a-name-of-16-byt"}, want: []string{"flowtable_devices[0]", "a-name-of-16-byt"}},
		{file: "masquerade_bit = 0\n", want: []string{"masquerade_bit", "0x0"}},
		{args: []string{"--listen", "127.0.0.1:99999"}, want: []string{"listen", "99999"}},
		{args: []string{"--listen", "127.0.0.1:http"}, want: []string{"listen", "http"}},
		{args: []string{"--node-name", "Bad_Node"}, want: []string{"node_name", "Bad_Node"}},
		{args: []string{"--node-name", strings.Repeat("n", 254)}, want: []string{"node_name", strings.Repeat("n", 254)}},
		{args: []string{"--zone", "zone a"}, want: []string{"zone", "zone a"}},
		{file: "proxy_name = \"a/b\"\n", want: []string{"proxy_name", "a/b"}},
		{file: "auth_user = \"a:b\"\nauth_password_file = \"/p\"\n", want: []string{"auth_user", "a:b"}},
		{args: []string{"--cluster-cidr", "fe80::1%eth0"}, want: []string{"cluster_cidrs[0]", "fe80::1%eth0"}},
		{file: "cluster_cidrs = [" + strings.Repeat("\"10.0.0.0/8\",", 257) + "]\n", want: []string{"cluster_cidrs", "257"}},
		{file: "manifest_max_file_size = \"1KiB\"\n", want: []string{"manifest_max_file_size", "1KiB"}},
		{args: []string{"--manifest-max-file-size", "2GiB"}, want: []string{"manifest_max_file_size", "2GiB"}},
		{args: []string{"--manifest-max-file-size", "huge"}, want: []string{"manifest-max-file-size", "huge"}},
		{args: []string{"--pprof", "--listen", ":9180"}, want: []string{"pprof", "listen", ":9180", "auth_user"}},
		{args: []string{"--pprof", "--listen", "0.0.0.0:9180"}, want: []string{"pprof", "listen", "0.0.0.0:9180"}},
		{args: []string{"--pprof", "--listen", "10.0.0.1:9180"}, want: []string{"pprof", "listen", "10.0.0.1:9180"}},
		{file: "http_allowed_hosts = [\"ok.example\", \"a b\"]\n", want: []string{"http_allowed_hosts[1]", "a b"}},
		{args: []string{"--http-allowed-host", "evil/x"}, want: []string{"http_allowed_hosts[0]", "evil/x"}},
		{file: "pod_routes = \"nodes\"\n", want: []string{"pod_routes", "nodes"}},
		{file: "pod_routes = \"bgp\"\ncluster_cidrs = [\"10.244.0.0/16\"]\n", want: []string{"pod_routes", "bgp", "[bgp]"}},
		{file: "pod_routes_table = 255\n", want: []string{"pod_routes_table", "255"}},
		{file: "pod_routes_nodes = [{name = \"n1\", internal_ips = [\"198.18.11.256\"]}]\n", want: []string{"pod_routes_nodes[0].internal_ips[0]", "198.18.11.256"}},
		{file: "pod_routes_nodes = [{name = \"N_1\"}]\n", want: []string{"pod_routes_nodes[0].name", "N_1"}},
		{file: "pod_routes_nodes = [{name = \"n1\", pod_cidrs = [\"10.244.1.0/33\"]}]\n", want: []string{"pod_routes_nodes[0].pod_cidrs[0]", "10.244.1.0/33"}},
		{file: "pod_routes_nodes = [{name = \"n1\", colour = 1}]\n", want: []string{"unknown key pod_routes_nodes.colour"}},
		{file: "tls_cert_file = \"c.pem\"\n", want: []string{"tls_cert_file", "tls_key_file"}},
		{file: "tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\ntls_self_signed_dir = \"/perm/tls\"\n", want: []string{"tls_self_signed_dir", "/perm/tls", "c.pem"}},
	})
}

// external_ip_cidrs: none by default; from the file or the repeatable
// flag, which replaces the file's list.
func TestExternalIPCIDRs(t *testing.T) {
	cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.exposure(nil).ExternalIPCIDRs) != 0 {
		t.Errorf("default external_ip_cidrs %v, want none", cfg.externalIPCIDRs)
	}
	p := writeConfig(t, "external_ip_cidrs = [\"203.0.113.7\", \"2001:db8::1/64\"]\n")
	cfg, _, err = loadConfig("nftgate", []string{"--node-name", "n", "--config", p})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.exposure(nil).ExternalIPCIDRs); got != "[203.0.113.7/32 2001:db8::/64]" {
		t.Errorf("external_ip_cidrs from the file: %s", got)
	}
	cfg, _, err = loadConfig("nftgate", []string{"--node-name", "n", "--config", p, "--external-ip-cidr", "198.51.100.0/24", "--external-ip-cidr", "192.0.2.0/25,192.0.2.128/25"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.exposure(nil).ExternalIPCIDRs); got != "[198.51.100.0/24 192.0.2.0/25 192.0.2.128/25]" {
		t.Errorf("external_ip_cidrs from flags: %s", got)
	}
}

// pprof without auth is accepted on loopback only.
func TestPprofWithoutAuthOnLoopback(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:9180", "[::1]:9180", "localhost:9180", "127.0.0.2:1"} {
		if _, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--pprof", "--listen", listen}); err != nil {
			t.Errorf("pprof on %s: %v", listen, err)
		}
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, "auth_user = \"admin\"\nauth_password_file = \""+pw+"\"\n")
	if _, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", p, "--pprof", "--listen", ":9180"}); err != nil {
		t.Errorf("pprof with auth on :9180: %v", err)
	}
}

func TestUnknownFlagIsAFlagError(t *testing.T) {
	_, fs, err := loadConfig("nftgate", []string{"--bogus"})
	var fe flagError
	if !errors.As(err, &fe) || fs == nil {
		t.Fatalf("got %v", err)
	}
	if code := run([]string{"--bogus"}); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
}

func TestMemoryLimitSizes(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"0": 0, "96MiB": 96 << 20, "1GiB": 1 << 30, "16384 KiB": 16 << 20, "16777216": 16 << 20, "16777217B": 16<<20 + 1,
	} {
		cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", writeConfig(t, "memory_limit = \""+in+"\"\n")})
		if err != nil {
			t.Errorf("memory_limit %q: %v", in, err)
			continue
		}
		if cfg.MemoryLimit != want {
			t.Errorf("memory_limit %q = %d, want %d", in, cfg.MemoryLimit, want)
		}
	}
	cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--memory-limit", "2GiB"})
	if err != nil || cfg.MemoryLimit != 2<<30 || cfg.MemoryLimit.String() != "2GiB" {
		t.Errorf("--memory-limit 2GiB: %v, %v", cfg, err)
	}
}

// render prints what the gateway would program: externalIPs only inside
// external_ip_cidrs.
func TestRenderServesExternalIPsOnlyInsideTheCIDRs(t *testing.T) {
	dir := t.TempDir()
	manifest := `apiVersion: v1
kind: Service
metadata: {name: legacy, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 198.19.0.40
  externalIPs: [198.19.1.2]
  ports: [{name: http, protocol: TCP, port: 80}]
`
	if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"--external-ip-cidr", "198.19.1.0/24"}, true}} {
		cfg, _, err := loadConfig("nftgate render", append([]string{"--node-name", "n", "--manifests", dir}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		if err := render(context.Background(), cfg, &out); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out.String(), "198.19.1.2 . tcp . 80"); got != c.want {
			t.Errorf("render %v: externalIP programmed %v, want %v:\n%s", c.args, got, c.want, out.String())
		}
		if !strings.Contains(out.String(), "198.19.0.40 . tcp . 80") {
			t.Errorf("render %v: the ClusterIP is missing:\n%s", c.args, out.String())
		}
	}
}

// manifest_max_file_size reaches the manifests source, from the file or
// the flag.
func TestManifestMaxFileSize(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, 32 << 20},
		{[]string{"--config", writeConfig(t, "manifest_max_file_size = \"8MiB\"\n")}, 8 << 20},
		{[]string{"--config", writeConfig(t, "manifest_max_file_size = \"8MiB\"\n"), "--manifest-max-file-size", "64KiB"}, 64 << 10},
	} {
		cfg, _, err := loadConfig("nftgate", append([]string{"--node-name", "n", "--manifests", t.TempDir()}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		src, err := cfg.source(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if ms, ok := src.(*source.ManifestSource); !ok || ms.MaxFileSize != tc.want {
			t.Errorf("%v: source %#v, want a manifests source reading files up to %d bytes", tc.args, src, tc.want)
		}
	}
}

// shards: "auto" by default, in the file or as a flag; a number fixes it.
func TestShardsSetting(t *testing.T) {
	for _, c := range []struct {
		file string
		args []string
		want Shards
	}{
		{want: ShardsAuto},
		{file: "shards = 64\n", want: 64},
		{file: "shards = \"auto\"\n", want: ShardsAuto},
		{file: "shards = 8\n", args: []string{"--shards", "auto"}, want: ShardsAuto},
		{args: []string{"--shards", "32"}, want: 32},
	} {
		args := append([]string{"--node-name", "n"}, c.args...)
		if c.file != "" {
			args = append(args, "--config", writeConfig(t, c.file))
		}
		cfg, _, err := loadConfig("nftgate", args)
		if err != nil {
			t.Fatalf("%q %v: %v", c.file, c.args, err)
		}
		if cfg.Shards != c.want {
			t.Errorf("%q %v: shards %v, want %v", c.file, c.args, cfg.Shards, c.want)
		}
		if (cfg.Shards.chooseShards() != nil) != (c.want == ShardsAuto) || cfg.ruleset().Shards != c.want.count() {
			t.Errorf("%q %v: chosen %v, ruleset shards %d", c.file, c.args, cfg.Shards.chooseShards() != nil, cfg.ruleset().Shards)
		}
	}
}

// TestConntrackEventsSetting: with state sync the ruleset silences the
// events of untranslated connections unless conntrack_events = "all", and
// keeps only five of a masqueraded Service TCP connection's with "lean";
// without [gateways] or without the sync it does neither.
func TestConntrackEventsSetting(t *testing.T) {
	const set = "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n%s[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n"
	for _, tc := range []struct {
		file       string
		want, lean bool
	}{
		{"", false, false},
		{fmt.Sprintf(set, ""), true, false},
		{fmt.Sprintf(set, "conntrack_events = \"lean\"\n"), true, true},
		{fmt.Sprintf(set, "conntrack_events = \"services\"\n"), true, false},
		{fmt.Sprintf(set, "conntrack_events = \"all\"\n"), false, false},
		{fmt.Sprintf(set, "state_sync = false\n"), false, false},
	} {
		args := []string{"--node-name", "n"}
		if tc.file != "" {
			args = append(args, "--config", writeConfig(t, tc.file))
		}
		cfg, _, err := loadConfig("nftgate", args)
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		if got := cfg.ruleset().UntranslatedEventsOff; got != tc.want {
			t.Errorf("%q: UntranslatedEventsOff %t, want %t", tc.file, got, tc.want)
		}
		if got := cfg.ruleset().LeanServiceEvents; got != tc.lean {
			t.Errorf("%q: LeanServiceEvents %t, want %t", tc.file, got, tc.lean)
		}
	}
}

// [gateways] track_interfaces: by default the [l2] interfaces, the links
// the addresses are answered on, and those towards the BGP peers; given,
// exactly those; empty, none.
func TestTrackInterfacesDefaultToTheL2Ones(t *testing.T) {
	const set = "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n%s[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n[l2]\ninterfaces = [\"up0\", \"cl0\"]\n"
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"", []string{"up0", "cl0"}},
		{"track_interfaces = [\"bond0\"]\n", []string{"bond0"}},
		{"track_interfaces = []\n", []string{}},
	} {
		cfg, _, err := loadConfig("nftgate", []string{"--config", writeConfig(t, fmt.Sprintf(set, tc.key)), "--node-name", "n"})
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Gateways.TrackInterfaces; !slices.Equal(got, tc.want) {
			t.Errorf("%q: track_interfaces %q, want %q", tc.key, got, tc.want)
		}
		// Only by default are the links towards the BGP peers tracked too.
		if cfg.trackDefault != (tc.key == "") {
			t.Errorf("%q: the links towards the BGP peers tracked: %v", tc.key, cfg.trackDefault)
		}
		if got := *cfg.Gateways.TrackUpAfter; got != gateways.DefaultTrackUpAfter {
			t.Errorf("%q: track_up_after %v, want %v", tc.key, got, gateways.DefaultTrackUpAfter)
		}
	}
}

// With [bgp] and track_interfaces not given, the links towards the BGP
// peers are tracked (and so window tracking is made liberal with state
// sync) even without [l2]; given, only those listed.
func TestTrackTowardsTheBGPPeersByDefault(t *testing.T) {
	const set = "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\n%s[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\n" +
		"[bgp]\nasn = 64513\nrouter_id = \"198.18.0.2\"\n[[bgp.peer]]\naddress = \"198.18.0.1\"\nasn = 64512\n"
	for _, tc := range []struct {
		key     string
		towards []netip.Addr
		tracks  bool
	}{
		{"", []netip.Addr{netip.MustParseAddr("198.18.0.1")}, true},
		{"track_interfaces = [\"eth1\"]\n", nil, true},
		{"track_interfaces = []\n", nil, false},
	} {
		cfg, _, err := loadConfig("nftgate", []string{"--config", writeConfig(t, fmt.Sprintf(set, tc.key)), "--node-name", "n"})
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.trackTowards(); !slices.Equal(got, tc.towards) || cfg.tracksLinks() != tc.tracks {
			t.Errorf("%q: towards %v, tracks links %v; want %v, %v", tc.key, got, cfg.tracksLinks(), tc.towards, tc.tracks)
		}
	}
}
