package e2e_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// gatewayClient is an HTTP client inside the gateway's namespace.
func gatewayClient(topo *lab.Topology, tlsConfig *tls.Config) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return topo.Gateway.DialContext(ctx, network, addr)
		},
		TLSClientConfig:   tlsConfig,
		DisableKeepAlives: true,
	}}
}

func request(c *http.Client, url, host, user, pw string) (int, string, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	if host != "" {
		req.Host = host
	}
	if user != "" {
		req.SetBasicAuth(user, pw)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestStatusServerHTTPSWithAuth runs the binary with a self-signed
// certificate kept in a directory and basic authentication: the status
// server speaks HTTPS only, with the certificate it made on the first
// start and kept across a restart, and the API answers only with the
// password; health stays open.
func TestStatusServerHTTPSWithAuth(t *testing.T) {
	topo := labtest.Gateway(t)
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("auth_user = \"admin\"\nauth_password_file = %q\ntls_self_signed_dir = %q\n", pwFile, tlsDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, topo, "--config", cfg)
	g.Launch()

	// The operator trusts the certificate the gateway made (read from its
	// directory), with full verification of the address it connects to.
	var pool *x509.CertPool
	var certPEM []byte
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		if !g.Running() {
			return fmt.Errorf("nftgate exited")
		}
		b, err := os.ReadFile(filepath.Join(tlsDir, "cert.pem"))
		if err != nil {
			return err
		}
		certPEM, pool = b, x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		return nil
	}); err != nil {
		t.Fatalf("no certificate made: %v\n%s", err, g.Logs())
	}
	if st, err := os.Stat(filepath.Join(tlsDir, "key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", st, err)
	}
	https := gatewayClient(topo, &tls.Config{RootCAs: pool})
	const base = "https://127.0.0.1:9180"
	waitReady := func() {
		t.Helper()
		if err := lab.EventuallyWithin(30*time.Second, func() error {
			code, body, err := request(https, base+"/readyz", "", "", "")
			if err != nil {
				return err
			}
			if code != 200 {
				return fmt.Errorf("readyz %d: %s", code, body)
			}
			return nil
		}); err != nil {
			t.Fatalf("not ready over HTTPS: %v\n%s", err, g.Logs())
		}
	}
	waitReady()
	if !strings.Contains(g.Logs(), "self-signed certificate created") {
		t.Errorf("the new certificate was not logged:\n%s", g.Logs())
	}
	for _, c := range []struct {
		path, user, pw string
		want           int
	}{
		{"/api/v1/status", "", "", 401},
		{"/api/v1/status", "admin", "wrong", 401},
		{"/api/v1/status", "nobody", "s3cret", 401},
		{"/api/v1/status", "admin", "s3cret", 200},
		{"/healthz", "", "", 200},
	} {
		code, body, err := request(https, base+c.path, "", c.user, c.pw)
		if err != nil || code != c.want {
			t.Errorf("%s as %q: %d %v, want %d (%.200s)", c.path, c.user, code, err, c.want, body)
		}
	}
	// Plain HTTP gets Go's refusal, never the API.
	if code, _, err := request(gatewayClient(topo, nil), "http://127.0.0.1:9180/api/v1/status", "", "admin", "s3cret"); err != nil || code != 400 {
		t.Errorf("plain HTTP on the HTTPS port: %d %v, want 400", code, err)
	}
	// Failed logins are logged with the client.
	if !strings.Contains(g.Logs(), `msg="login failed" client=127.0.0.1:`) {
		t.Errorf("failed logins not logged:\n%s", g.Logs())
	}

	// A restart serves the same certificate.
	g.Stop()
	g.Launch()
	waitReady()
	if b, _ := os.ReadFile(filepath.Join(tlsDir, "cert.pem")); !bytes.Equal(b, certPEM) {
		t.Error("the certificate changed across a restart")
	}
	if code, _, err := request(https, base+"/api/v1/status", "", "admin", "s3cret"); err != nil || code != 200 {
		t.Errorf("after a restart: %d %v", code, err)
	}
}

// TestStatusServerHostCheck: without authentication the status server
// answers only to IP addresses, localhost and http_allowed_hosts.
func TestStatusServerHostCheck(t *testing.T) {
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, "--http-allowed-host", "gw.example.org")
	g.Start()
	c := gatewayClient(topo, nil)
	for _, tc := range []struct {
		host string
		want int
	}{
		{"127.0.0.1:9180", 200}, {"localhost:9180", 200}, {"gw.example.org:9180", 200},
		{"rebound.example:9180", 421}, {"127.0.0.1.rebound.example", 421},
	} {
		code, body, err := request(c, "http://127.0.0.1:9180/api/v1/status", tc.host, "", "")
		if err != nil || code != tc.want {
			t.Errorf("Host %q: %d %v, want %d (%.200s)", tc.host, code, err, tc.want, body)
		}
	}
}
