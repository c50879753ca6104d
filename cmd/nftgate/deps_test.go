package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

// TestBinaryHasNoTestHarness: nothing of the test support (internal/testing,
// packages named *test) nor the standard library's testing package is
// linked into the binary.
func TestBinaryHasNoTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Name}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		path, name, _ := strings.Cut(strings.TrimSpace(line), " ")
		own := strings.HasPrefix(path, repo.Module+"/")
		switch {
		case path == "testing",
			strings.HasPrefix(path, repo.Module+"/internal/testing/"),
			own && strings.HasSuffix(name, "test"):
			t.Errorf("the binary depends on %s", path)
		}
	}
}
