// Package repo finds the nftgate repository on disk, for tests and tools
// that need its files (the Makefile, deploy/, examples/) or its build/
// directory, wherever in the tree they are compiled or run.
package repo

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Module is the module path that go.mod at the repository root declares.
const Module = "github.com/nftgate/nftgate"

// Root returns the directory of the go.mod that declares Module: the first
// above the working directory (where `go test` runs), else the first above
// this source file.
func Root() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err == nil && bytes.Contains(data, []byte("module "+Module+"\n")) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("no go.mod of module %s above %v", Module, starts)
}

// Path joins elem to the repository root; it fails t when the root is not
// found.
func Path(t testing.TB, elem ...string) string {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(append([]string{root}, elem...)...)
}
