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
