package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The timeline picks events out of the log by message: a message reworded
// in its room would silently leave the timeline.
func TestEventMessagesAreLogged(t *testing.T) {
	var src strings.Builder
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "internal" || d.Name() == "e2e" || strings.HasPrefix(d.Name(), ".")) && p != "../.." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") && filepath.Base(p) != "page.go" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			src.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	all := src.String()
	for msg := range eventMessages {
		if !strings.Contains(all, "("+strconv.Quote(msg)+",") && !strings.Contains(all, "("+strconv.Quote(msg)+")") {
			t.Errorf("no log call with the message %q: the timeline would miss these events", msg)
		}
	}
}
