package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// TestSpecialFilesInManifests drops a FIFO and a link to /dev/zero into the
// directory of a running gateway (and has a FIFO there from the start):
// nftgate neither hangs nor runs out of memory, keeps serving every other
// Service, applies a later change, and names the files in /api/v1/status
// and nftgate_source_problems.
func TestSpecialFilesInManifests(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g := gatewaytest.New(t, topo)
	fifo := func(name string) string {
		path := filepath.Join(g.Dir, name)
		if err := syscall.Mkfifo(path, 0o644); err != nil {
			t.Fatal(err)
		}
		// A reader that blocked on it (as nftgate did) is let go at the end.
		t.Cleanup(func() {
			if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		})
		return path
	}
	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	api := gatewaytest.Service("default", "api", "ClusterIP", []string{"198.19.0.11"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("api.yaml", api, gatewaytest.Slice("default", "api-1", "api", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	atStart := fifo("at-start.yaml")
	g.Start()
	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.10:8080", 5*time.Second); err != nil {
		t.Fatalf("not serving with a FIFO in the directory at start: %v", err)
	}

	later := fifo("later.yaml")
	zero := filepath.Join(g.Dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	// A change after them still reaches the kernel.
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.11:8080", 10*time.Second); err != nil {
		t.Fatalf("a change after a FIFO and a /dev/zero link were added did not apply: %v", err)
	}
	if r, err := topo.Client.Dial("tcp", ap("198.19.0.11:80"), lab.DialOpts{}); err != nil || r.Backend != "198.18.2.10:8080" {
		t.Errorf("the other Service stopped serving: %v %v", r.Backend, err)
	}

	want := []string{atStart, later, zero}
	err := lab.EventuallyWithin(10*time.Second, func() error {
		code, body, err := g.Get("/api/v1/status")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("status: %d %v", code, err)
		}
		var st struct {
			SourceProblems []string `json:"sourceProblems"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		for _, w := range want {
			if !slices.ContainsFunc(st.SourceProblems, func(p string) bool { return strings.HasPrefix(p, w+":") }) {
				return fmt.Errorf("sourceProblems %q do not name %s", st.SourceProblems, w)
			}
		}
		if len(st.SourceProblems) != len(want) {
			return fmt.Errorf("sourceProblems %q, want one for each of %q", st.SourceProblems, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := metric(t, g, "nftgate_source_problems"); n != 3 {
		t.Errorf("nftgate_source_problems = %v, want 3", n)
	}
	if code, body, err := g.Get("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("healthz: %d %q %v", code, body, err)
	}
	t.Run("status page", func(t *testing.T) {
		browsertest.Chromium(t)
		const host = "127.0.0.1:9180"
		b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateway.Name()})
		b.Navigate("http://" + host + "/")
		b.Poll("first refresh", `document.body.dataset.loaded === 'true'`)
		if got := b.Text("#c-rejected"); got != "3 files" {
			t.Errorf("rejected = %q, want 3 files", got)
		}
		shown := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('#source-problems-list li'), e => e.textContent)`)
		for _, w := range want {
			if !slices.ContainsFunc(shown, func(p string) bool { return strings.HasPrefix(p, w+":") }) {
				t.Errorf("the page's source problems %q do not name %s", shown, w)
			}
		}
		b.Screenshot(browsertest.ArtifactDir(t, "nftgate"), "source-problems.png")
		b.Check()
	})

	// Once the files go, so do the problems.
	for _, p := range want {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	err = lab.EventuallyWithin(10*time.Second, func() error {
		if n := metric(t, g, "nftgate_source_problems"); n != 0 {
			return fmt.Errorf("nftgate_source_problems = %v", n)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if !g.Running() {
		t.Fatalf("nftgate exited:\n%s", g.Logs())
	}
}
