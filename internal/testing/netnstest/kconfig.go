package netnstest

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"testing"
)

// KernelHas tells whether the running kernel was built with every one of
// the options (built in or as modules), from /proc/config.gz. It skips the
// test when the configuration is not readable.
func KernelHas(t testing.TB, options ...string) bool {
	t.Helper()
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		t.Skipf("the kernel's configuration is not readable: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("/proc/config.gz: %v", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("/proc/config.gz: %v", err)
	}
	b = append([]byte("\n"), b...)
	for _, opt := range options {
		if !bytes.Contains(b, []byte("\n"+opt+"=y\n")) && !bytes.Contains(b, []byte("\n"+opt+"=m\n")) {
			return false
		}
	}
	return true
}
