package repo_test

import (
	"os"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

func TestRootHoldsTheModule(t *testing.T) {
	for _, f := range [][]string{{"go.mod"}, {"Makefile"}, {"cmd", "nftgate", "main.go"}} {
		if _, err := os.Stat(repo.Path(t, f...)); err != nil {
			t.Errorf("%v not under the repository root: %v", f, err)
		}
	}
}

func TestRootFromElsewhere(t *testing.T) {
	// From a directory outside the repository, the root is found from
	// this package's source file.
	t.Chdir(t.TempDir())
	if _, err := os.Stat(repo.Path(t, "go.mod")); err != nil {
		t.Fatal(err)
	}
}
