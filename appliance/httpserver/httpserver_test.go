package httpserver_test

import (
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/nftgate/nftgate/appliance/httpserver"
	"github.com/nftgate/nftgate/appliance/httpserver/httpservertest"
)

// serve runs srv on a loopback port until the test ends.
func serve(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })

// Short limits, so that each check ends in a fraction of its patience.
var short = httpserver.Limits{ReadHeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond, MaxHeaderBytes: 4096}

func TestIdleConnectionIsClosed(t *testing.T) {
	addr := serve(t, httpserver.New(ok, short))
	if err := httpservertest.IdleIsClosed(addr, "/"); err != nil {
		t.Fatal(err)
	}
}

func TestSlowHeaderIsCut(t *testing.T) {
	addr := serve(t, httpserver.New(ok, short))
	if err := httpservertest.SlowHeaderIsCut(addr, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

func TestLargeHeaderIsRefused(t *testing.T) {
	addr := serve(t, httpserver.New(ok, short))
	if err := httpservertest.LargeHeaderIsRefused(addr, short.MaxHeaderBytes); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultsFillZeroFields(t *testing.T) {
	srv := httpserver.New(ok, httpserver.Limits{IdleTimeout: time.Second})
	d := httpserver.Default
	if srv.IdleTimeout != time.Second || srv.ReadHeaderTimeout != d.ReadHeaderTimeout || srv.ReadTimeout != d.ReadTimeout ||
		srv.WriteTimeout != d.WriteTimeout || srv.MaxHeaderBytes != d.MaxHeaderBytes {
		t.Errorf("server limits %+v, want Default with IdleTimeout 1s", srv)
	}
	for name, v := range map[string]time.Duration{"ReadHeaderTimeout": d.ReadHeaderTimeout, "ReadTimeout": d.ReadTimeout,
		"WriteTimeout": d.WriteTimeout, "IdleTimeout": d.IdleTimeout} {
		if v <= 0 {
			t.Errorf("Default.%s = %s: unlimited", name, v)
		}
	}
}
