package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/source"
)

// manifestEnv is an Env that writes manifests into a temporary directory;
// it has no lab, only the backend addresses the objects name.
func manifestEnv(t *testing.T, perFile int) *Env {
	backends := make([]netip.Addr, maxEndpoints)
	for i := range backends {
		backends[i] = netip.AddrFrom4([4]byte{198, 18, 2, byte(10 + i)})
	}
	return &Env{
		Cfg:       &Config{Endpoints: 4},
		Topo:      &lab.Topology{BackendIPv4: backends},
		Manifests: &ManifestDir{Dir: t.TempDir(), PerFile: perFile},
		probeIPs:  map[int]netip.Addr{},
	}
}

// readManifests decodes every file of the directory with nftgate's own
// decoder and returns the Services and EndpointSlices by name, and the
// file names.
func readManifests(t *testing.T, dir string) (map[string]*corev1.Service, map[string]*discoveryv1.EndpointSlice, []string) {
	t.Helper()
	files, err := source.ManifestFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	svcs := map[string]*corev1.Service{}
	slices := map[string]*discoveryv1.EndpointSlice{}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		objs, err := source.ReadManifestFile(f, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch o := o.(type) {
			case *corev1.Service:
				if _, dup := svcs[o.Name]; dup {
					t.Errorf("Service %s twice", o.Name)
				}
				svcs[o.Name] = o
			case *discoveryv1.EndpointSlice:
				if _, dup := slices[o.Name]; dup {
					t.Errorf("EndpointSlice %s twice", o.Name)
				}
				slices[o.Name] = o
			default:
				t.Errorf("%s: unexpected %T", f, o)
			}
		}
	}
	return svcs, slices, names
}

func TestManifestWriter(t *testing.T) {
	e := manifestEnv(t, 1000)
	if err := e.writeFixed(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// 2,500 bulk Services, then more: the half-filled third file is
	// written again whole and a fourth added.
	for _, n := range []int{2500 + fixedCount, 3700 + fixedCount} {
		if _, err := e.LoadTo(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	svcs, sls, files := readManifests(t, e.Manifests.Dir)
	wantFiles := []string{"bulk-000000.json", "bulk-000001.json", "bulk-000002.json", "bulk-000003.json", canaryFile, changeFile}
	if !slices.Equal(files, wantFiles) {
		t.Errorf("files %q, want %q", files, wantFiles)
	}
	entries, err := os.ReadDir(e.Manifests.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(wantFiles) {
		t.Errorf("%d entries in the directory, want %d (temporary files left?)", len(entries), len(wantFiles))
	}
	if len(svcs) != 3702 || len(sls) != 3702 {
		t.Fatalf("%d Services and %d EndpointSlices, want 3,702 of each", len(svcs), len(sls))
	}
	for i := range 3700 {
		name := fmt.Sprintf(firstBulkName, i)
		svc, sl := svcs[name], sls[name]
		if svc == nil || sl == nil {
			t.Fatalf("bulk Service %d (%s): Service %v, EndpointSlice %v", i, name, svc != nil, sl != nil)
		}
		ip, _ := bulkIP(i)
		if svc.Namespace != namespace || svc.Spec.ClusterIP != ip.String() || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != servicePort {
			t.Fatalf("Service %s: namespace %q, clusterIP %q, ports %v; want %s, %s, port %d", name, svc.Namespace,
				svc.Spec.ClusterIP, svc.Spec.Ports, namespace, ip, servicePort)
		}
		wantSlice(t, sl, name, bulkPort, 4)
	}
	for name, ip := range map[string]netip.Addr{canaryName: canaryIP, changeName: changeIP} {
		if svcs[name] == nil || svcs[name].Spec.ClusterIP != ip.String() {
			t.Errorf("Service %s: %v, want ClusterIP %s", name, svcs[name], ip)
		}
	}
	wantSlice(t, sls[canaryName], canaryName, canaryPort, 4)
	wantSlice(t, sls[changeName], changeName, changePortA, 4)
	for _, ep := range sls[canaryName].Endpoints {
		if !slices.Contains(e.Topo.BackendIPv4[:4], netip.MustParseAddr(ep.Addresses[0])) {
			t.Errorf("canary endpoint %s is not one of the echo servers' addresses", ep.Addresses[0])
		}
	}

	// The probes the cold start waits for are the first, middle and last
	// bulk Services written.
	var probes []string
	for _, p := range e.Probes() {
		probes = append(probes, p.Name+"="+p.Dst.Addr().String())
	}
	first, _ := bulkIP(0)
	mid, _ := bulkIP(1850)
	last, _ := bulkIP(3699)
	wantProbes := []string{"canary=" + canaryIP.String(), "svc-000000=" + first.String(), "svc-001850=" + mid.String(), "svc-003699=" + last.String()}
	if !slices.Equal(probes, wantProbes) {
		t.Errorf("probes %q, want %q", probes, wantProbes)
	}

	// Each change rewrites only the changed Service's file, alternating
	// its endpoints' port.
	bulkBefore, err := os.Stat(filepath.Join(e.Manifests.Dir, "bulk-000000.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint16{changePortB, changePortA, changePortB} {
		port, at, err := e.ChangeEndpoints(ctx)
		if err != nil || port != want || at.IsZero() {
			t.Fatalf("ChangeEndpoints = %d, %v, %v; want port %d", port, at, err, want)
		}
		svcs, sls, _ := readManifests(t, e.Manifests.Dir)
		wantSlice(t, sls[changeName], changeName, int32(want), 4)
		if svcs[changeName] == nil || svcs[changeName].Spec.ClusterIP != changeIP.String() {
			t.Errorf("after the change, Service %s: %v", changeName, svcs[changeName])
		}
		if e.ChangePort() != want {
			t.Errorf("ChangePort() = %d, want %d", e.ChangePort(), want)
		}
	}
	bulkAfter, err := os.Stat(filepath.Join(e.Manifests.Dir, "bulk-000000.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bulkAfter.ModTime().Equal(bulkBefore.ModTime()) {
		t.Error("an endpoint change rewrote a bulk file")
	}
}

func wantSlice(t *testing.T, sl *discoveryv1.EndpointSlice, service string, port int32, endpoints int) {
	t.Helper()
	if sl == nil {
		t.Fatalf("no EndpointSlice for %s", service)
	}
	if sl.Labels[discoveryv1.LabelServiceName] != service || sl.Namespace != namespace ||
		len(sl.Ports) != 1 || sl.Ports[0].Port == nil || *sl.Ports[0].Port != port || len(sl.Endpoints) != endpoints {
		t.Fatalf("EndpointSlice %s: labels %v, namespace %q, ports %v, %d endpoints; want Service %s, port %d, %d endpoints",
			sl.Name, sl.Labels, sl.Namespace, sl.Ports, len(sl.Endpoints), service, port, endpoints)
	}
	for _, ep := range sl.Endpoints {
		if len(ep.Addresses) != 1 || ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
			t.Fatalf("EndpointSlice %s: endpoint %v not one ready address", sl.Name, ep)
		}
	}
}

func TestManifestWriteError(t *testing.T) {
	m := &ManifestDir{Dir: filepath.Join(t.TempDir(), "missing")}
	_, err := m.Write(changeFile, service(changeName, changeIP))
	if err == nil || !strings.Contains(err.Error(), changeFile) {
		t.Errorf("writing into a missing directory: %v, want an error naming %s", err, changeFile)
	}
}

func TestParseFlagsSource(t *testing.T) {
	// The binaries must exist for parseFlags to accept a configuration.
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin}
	cfg, err := parseFlags(append(bins, "--source", "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != sourceManifests || !slices.Equal(cfg.Proxiers, []string{proxNftgate}) || cfg.ManifestsPerFile != 1000 {
		t.Errorf("--source manifests: source %q, proxiers %q, %d per file; want manifests, nftgate alone, 1000",
			cfg.Source, cfg.Proxiers, cfg.ManifestsPerFile)
	}
	cfg, err = parseFlags(bins)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != sourceAPI || !slices.Equal(cfg.Proxiers, allProxiers) {
		t.Errorf("defaults: source %q, proxiers %q; want api and all proxiers", cfg.Source, cfg.Proxiers)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "etcd"}, `--source: "etcd"`},
		{[]string{"--source", "manifests", "--proxiers", "nftgate,kube-proxy-nftables"}, `"kube-proxy-nftables" cannot read manifests`},
		{[]string{"--source", "manifests", "--proxiers", "kube-proxy-iptables"}, `"kube-proxy-iptables" cannot read manifests`},
		{[]string{"--source", "manifests", "--api-server-arg=--profiling=true"}, "no kube-apiserver runs"},
		{[]string{"--source", "manifests", "--manifest-services-per-file", "0"}, "--manifest-services-per-file: 0"},
	} {
		_, err := parseFlags(append(bins, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
