package main

import (
	"os/exec"
	"slices"
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

// TestBinaryLinksNoClientset: nothing in the binary imports client-go's
// clientset, informer factory, event recorder or leader election. Each of
// them imports k8s.io/client-go/kubernetes/scheme, which links and
// registers every API group of Kubernetes at start: tens of megabytes of
// binary and of resident memory for the few kinds internal/kubeclient
// serves.
func TestBinaryLinksNoClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/informers",
		"k8s.io/client-go/applyconfigurations",
		"k8s.io/client-go/tools/record",
		"k8s.io/client-go/tools/leaderelection",
	}
	isForbidden := func(path string) bool {
		return slices.ContainsFunc(forbidden, func(f string) bool { return path == f || strings.HasPrefix(path, f+"/") })
	}
	// Named: what brings them in, not what they import among themselves.
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		fields := strings.Fields(line)
		if isForbidden(fields[0]) {
			continue
		}
		for _, imp := range fields[1:] {
			if isForbidden(imp) {
				t.Errorf("%s imports %s", fields[0], imp)
			}
		}
	}
}
