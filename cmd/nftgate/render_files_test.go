package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRenderRefusesSpecialFiles: `nftgate render` names a FIFO or a link
// to /dev/zero in the directory and stops, at once, instead of hanging or
// running out of memory; a file over manifest_max_file_size likewise.
func TestRenderRefusesSpecialFiles(t *testing.T) {
	for name, create := range map[string]func(t *testing.T, path string){
		"FIFO": func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
			})
		},
		"/dev/zero": func(t *testing.T, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		},
		"oversized": func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(strings.Repeat("# padding\n", 1000)), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			bad := filepath.Join(dir, "bad.yaml")
			create(t, bad)
			cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--manifests", dir, "--manifest-max-file-size", "4KiB"})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- render(context.Background(), cfg, io.Discard) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), bad) {
					t.Errorf("render: %v, want an error naming %s", err, bad)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("render did not return")
			}
		})
	}
}

// TestRenderAllocatesFromPools: without a cluster, a LoadBalancer Service
// without a status gets its address from the pool, and the ruleset serves
// it; one with a status in its manifest keeps that address.
func TestRenderAllocatesFromPools(t *testing.T) {
	dir := t.TempDir()
	manifest := `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports: [{port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: fixed, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  ports: [{port: 80, protocol: TCP}]
status:
  loadBalancer: {ingress: [{ip: 198.51.100.9}]}
`
	if err := os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, "[[pools]]\nname = \"public\"\naddresses = [\"203.0.113.64/30\"]\nskip_network_and_broadcast = true\n")
	cfg, _, err := loadConfig("nftgate", []string{"--config", p, "--node-name", "n", "--manifests", dir})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := render(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"203.0.113.65", "198.51.100.9"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the rendered ruleset does not serve %s", want)
		}
	}
	if strings.Contains(out.String(), "203.0.113.64 ") {
		t.Error("the network address was handed out")
	}
}
