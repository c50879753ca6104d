package source

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
)

// manifestAPI is a second Service, with its EndpointSlice.
var manifestAPI = strings.NewReplacer("name: web", "name: api", "service-name: web", "service-name: api",
	"10.96.0.10", "10.96.0.11", "web-1", "api-1").Replace(manifestWeb)

var (
	keyWeb = model.NewServiceKey("shop", "web")
	keyAPI = model.NewServiceKey("shop", "api")
)

// scanWithin runs a full scan and fails the test when it does not return
// within the deadline (a read that blocks, on a FIFO say).
func scanWithin(t *testing.T, m *ManifestSource, tr *loop.Tracker, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		m.scan(tr, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("scan of %s did not return within %s", m.Dir, d)
	}
}

// unblockFIFO opens a FIFO for writing at cleanup, so that a reader blocked
// on it (before the source refused FIFOs) returns and the test ends.
func unblockFIFO(t *testing.T, path string) {
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestManifestSourceRefusesFiles: files that are not regular files inside
// the directory, oversized files and files of NUL bytes are refused by
// name, never block the scan, and every other file keeps serving.
func TestManifestSourceRefusesFiles(t *testing.T) {
	const limit = 64 << 10
	cases := []struct {
		name string
		// make creates the bad file path in dir.
		make func(t *testing.T, dir, path string)
		// want are words of the problem reported for it.
		want []string
	}{
		{"FIFO", func(t *testing.T, dir, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
			unblockFIFO(t, path)
		}, []string{"FIFO", "not a regular file"}},
		{"symlink to a FIFO", func(t *testing.T, dir, path string) {
			fifo := filepath.Join(dir, "fifo")
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Fatal(err)
			}
			unblockFIFO(t, fifo)
			if err := os.Symlink("fifo", path); err != nil {
				t.Fatal(err)
			}
		}, []string{"FIFO", "not a regular file"}},
		{"symlink to /dev/zero", func(t *testing.T, dir, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, []string{"/dev/zero", "character device"}},
		{"symlink to /dev/urandom", func(t *testing.T, dir, path string) {
			if err := os.Symlink("/dev/urandom", path); err != nil {
				t.Fatal(err)
			}
		}, []string{"/dev/urandom", "character device"}},
		{"device node", func(t *testing.T, dir, path string) {
			// /dev/zero's own device numbers, in the directory itself.
			if err := unix.Mknod(path, unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))); err != nil {
				t.Skipf("mknod: %v", err)
			}
		}, []string{"character device", "not a regular file"}},
		{"socket", func(t *testing.T, dir, path string) {
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, []string{"socket", "not a regular file"}},
		{"symlink out of the directory", func(t *testing.T, dir, path string) {
			out := filepath.Join(t.TempDir(), "api.yaml")
			writeFile(t, out, manifestAPI)
			if err := os.Symlink(out, path); err != nil {
				t.Fatal(err)
			}
		}, []string{"leaves the manifests directory"}},
		{"sparse file over the limit", func(t *testing.T, dir, path string) {
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(200 << 20); err != nil {
				t.Fatal(err)
			}
		}, []string{"209715200 bytes", "manifest_max_file_size", "65536 bytes"}},
		{"file over the limit", func(t *testing.T, dir, path string) {
			writeFile(t, path, manifestAPI+strings.Repeat("# padding\n", limit/10))
		}, []string{"larger than", "manifest_max_file_size"}},
		{"NUL bytes", func(t *testing.T, dir, path string) {
			writeFile(t, path, string(make([]byte, 4096)))
		}, []string{"NUL byte at offset 0"}},
		{"NUL bytes after a manifest", func(t *testing.T, dir, path string) {
			writeFile(t, path, manifestAPI+string(make([]byte, 100)))
		}, []string{"NUL byte at offset"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "web.yaml"), manifestWeb)
			bad := filepath.Join(dir, "bad.yaml")
			c.make(t, dir, bad)
			m := &ManifestSource{Dir: dir, MaxFileSize: limit}
			tr := loop.NewTracker()
			scanWithin(t, m, tr, 10*time.Second)
			all, _ := tr.All()
			if o := all[keyWeb]; o.Service == nil || len(o.Slices) != 1 {
				t.Errorf("the good file does not serve: %v", all)
			}
			if _, ok := all[keyAPI]; ok {
				t.Errorf("the refused file's Service is served: %v", all)
			}
			p := m.Problems()
			if len(p) != 1 || !strings.Contains(p[0], bad) {
				t.Fatalf("problems %q, want one naming %s", p, bad)
			}
			for _, w := range c.want {
				if !strings.Contains(p[0], w) {
					t.Errorf("problem %q does not say %q", p[0], w)
				}
			}
		})
	}
}

// TestManifestSourceSymlinkInside: a symlink to a file inside the
// directory is read, as a mounted ConfigMap holds its files.
func TestManifestSourceSymlinkInside(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_24", "web.yaml")
	if err := os.MkdirAll(filepath.Dir(data), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, data, manifestWeb)
	if err := os.Symlink("..2026_11_24", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/web.yaml", filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	// An absolute link to a file inside, through a link to the directory.
	writeFile(t, filepath.Join(dir, "..2026_11_24", "api.yaml"), manifestAPI)
	link := filepath.Join(t.TempDir(), "manifests")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(link, "..data", "api.yaml"), filepath.Join(dir, "api.yaml")); err != nil {
		t.Fatal(err)
	}
	m := &ManifestSource{Dir: link}
	tr := loop.NewTracker()
	scanWithin(t, m, tr, 10*time.Second)
	if all, _ := tr.All(); all[keyWeb].Service == nil || all[keyAPI].Service == nil {
		t.Errorf("a symlink inside the directory was not followed: %v", all)
	}
	if p := m.Problems(); len(p) != 0 {
		t.Errorf("problems %q, want none", p)
	}
}

// TestManifestSourceRefusedFileKeepsContent: a file replaced by something
// the source refuses keeps its previous content in effect, on a full scan
// and after a file event alike.
func TestManifestSourceRefusedFileKeepsContent(t *testing.T) {
	const limit = 64 << 10
	replace := map[string]func(t *testing.T, path string){
		"oversized": func(t *testing.T, path string) {
			changed := strings.Replace(manifestAPI, "10.1.0.1", "10.1.0.7", 1)
			writeFile(t, path, changed+strings.Repeat("# padding\n", limit/10))
		},
		"NUL bytes": func(t *testing.T, path string) {
			// What a crash can leave of a file whose blocks were not yet
			// written: a block of zeros.
			writeFile(t, path, string(make([]byte, 4096)))
		},
		"FIFO": func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
			unblockFIFO(t, path)
		},
	}
	for name, bad := range replace {
		for _, event := range []bool{false, true} {
			t.Run(name+map[bool]string{false: " full scan", true: " file event"}[event], func(t *testing.T) {
				dir := t.TempDir()
				web, api := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "api.yaml")
				writeFile(t, web, manifestWeb)
				writeFile(t, api, manifestAPI)
				m := &ManifestSource{Dir: dir, MaxFileSize: limit}
				tr := loop.NewTracker()
				scanWithin(t, m, tr, 10*time.Second)
				tr.TakeDirty()

				bad(t, api)
				writeFile(t, web, strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.2", 1))
				done := make(chan struct{})
				go func() {
					log := slog.New(slog.NewTextHandler(io.Discard, nil))
					if event {
						m.scanFiles(tr, log, map[string]bool{api: true, web: true})
					} else {
						m.scan(tr, log)
					}
					close(done)
				}()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("the scan did not return")
				}
				dirty, _ := tr.TakeDirty()
				if o, ok := dirty[keyAPI]; ok {
					t.Errorf("the refused file's Service changed: %+v", o)
				}
				if o := dirty[keyWeb]; o.Service == nil || endpointOf(t, o) != "10.1.0.2:8080" {
					t.Errorf("the good file's change did not apply: %v", dirty)
				}
				if all, _ := tr.All(); all[keyAPI].Service == nil {
					t.Errorf("the refused file's previous content is gone")
				}
				if p := m.Problems(); len(p) != 1 || !strings.Contains(p[0], api) {
					t.Errorf("problems %q, want one naming %s", p, api)
				}
			})
		}
	}
}

// TestReadManifestFileBounded: the largest file allowed is read; one byte
// more is refused before it is read.
func TestReadManifestFileBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yaml")
	content := manifestWeb + "# end\n"
	writeFile(t, path, content)
	if objs, err := ReadManifestFile(path, int64(len(content))); err != nil || len(objs) != 2 {
		t.Errorf("a file of exactly the limit: %v, %v", objs, err)
	}
	_, err := ReadManifestFile(path, int64(len(content)-1))
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a file one byte over the limit: %v", err)
	}
	// A file that is only whitespace and comments is empty, not an error.
	writeFile(t, path, "# nothing here\n\n---\n")
	if objs, err := ReadManifestFile(path, 0); err != nil || len(objs) != 0 {
		t.Errorf("a file of comments: %v, %v", objs, err)
	}
	if _, err := ReadManifestFile(filepath.Join(dir, "missing.yaml"), 0); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v, want not-exist", err)
	}
	var buf bytes.Buffer
	buf.WriteString(manifestWeb)
	buf.WriteByte(0)
	writeFile(t, path, buf.String())
	if _, err := ReadManifestFile(path, 0); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a NUL byte: %v, want an error naming the file", err)
	}
}
