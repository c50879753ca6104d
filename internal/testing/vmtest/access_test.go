package vmtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// access is what an operator of the box holds after `make image`: the
// passwords the build made (gokrazy's and the status page's) and the
// certificate the build made for gokrazy's web interface.
type access struct {
	gokrazyPassword, nftgatePassword string
	gokrazyRoots                     *x509.CertPool
}

// loadAccess reads them from where `make vmtest` says (environment), or
// from the build directory under root.
func loadAccess(t *testing.T, root string) access {
	t.Helper()
	file := func(env, def string) string {
		if p := os.Getenv(env); p != "" {
			return p
		}
		return filepath.Join(root, "build", def)
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("made by the image build: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	a := access{
		gokrazyPassword: read(file("NFTGATE_VMTEST_PASSWORD_FILE", "vmtest-password.txt")),
		nftgatePassword: read(file("NFTGATE_VMTEST_NFTGATE_PASSWORD_FILE", "vmtest-nftgate-password.txt")),
		gokrazyRoots:    x509.NewCertPool(),
	}
	if !a.gokrazyRoots.AppendCertsFromPEM([]byte(read(file("NFTGATE_VMTEST_GOKRAZY_CERT", "vmtest-gokrazy-tls/cert.pem")))) {
		t.Fatal("gokrazy's certificate: no PEM certificate")
	}
	return a
}

// gokrazyClient trusts gokrazy's certificate, with full verification of
// the box's address against it, and follows no redirect.
func (a access) gokrazyClient(ns *Netns) *http.Client {
	c := ns.HTTPClient(5 * time.Second)
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: a.gokrazyRoots}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// pinStatusCertificate waits until nftgate's status server at addr
// completes a TLS handshake, and returns a client that accepts exactly
// the certificate it presented then, as an operator pins a self-signed
// certificate on first contact (comparing the SHA-256 that nftgate logs).
// The certificate is made on the box's first boot, before its addresses
// are known, for its host name only: so the name is not verified, the pin
// is the trust.
func pinStatusCertificate(ctx context.Context, t *testing.T, vm *VM, ns *Netns, addr string) (*http.Client, []byte) {
	t.Helper()
	var pinned []byte
	var last error
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for pinned == nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		raw, err := ns.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) // only to read the certificate
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err = c.Handshake(); err == nil {
				pinned = c.ConnectionState().PeerCertificates[0].Raw
			}
			c.Close()
		}
		if pinned != nil {
			break
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("no TLS handshake with nftgate at %s: %v", addr, last)
		case <-vm.Done():
			t.Fatalf("QEMU exited before nftgate answered TLS at %s: %v", addr, last)
		case <-tick.C:
		}
	}
	sum := sha256.Sum256(pinned)
	t.Logf("nftgate's certificate pinned: SHA-256 %s", strings.ToUpper(hex.EncodeToString(sum[:])))
	c := ns.HTTPClient(5 * time.Second)
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyPeerCertificate: func(certs [][]byte, _ [][]*x509.Certificate) error {
			if len(certs) == 0 || !bytes.Equal(certs[0], pinned) {
				return errors.New("nftgate presented another certificate than the pinned one")
			}
			return nil
		},
	}
	return c, pinned
}

// checkStatusAccess checks that nftgate's status server at addr serves
// the API over TLS with the build's password only, and plain HTTP not at
// all; health stays open.
func checkStatusAccess(ctx context.Context, t *testing.T, vm *VM, ns *Netns, pinned *http.Client, a access, addr string) {
	t.Helper()
	base := "https://" + addr
	for _, c := range []struct {
		path, user, pw string
		want           int
	}{
		{"/api/v1/status", "", "", http.StatusUnauthorized},
		{"/api/v1/status", "admin", "wrong", http.StatusUnauthorized},
		{"/api/v1/status", "admin", a.nftgatePassword, http.StatusOK},
		{"/", "admin", a.nftgatePassword, http.StatusOK},
		{"/healthz", "", "", http.StatusOK},
	} {
		if _, err := vm.WaitHTTP(ctx, pinned, base+c.path, c.user, c.pw, wantCode(c.want)); err != nil {
			t.Errorf("nftgate %s as %q: %v", c.path, c.user, err)
		}
	}
	// Plain HTTP on the same port gets Go's answer for HTTP on an HTTPS
	// server, never the API.
	if _, err := vm.WaitHTTP(ctx, ns.HTTPClient(5*time.Second), "http://"+addr+"/api/v1/status", "admin", a.nftgatePassword,
		wantCode(http.StatusBadRequest)); err != nil {
		t.Errorf("nftgate over plain HTTP: %v", err)
	}
}

// checkGokrazyAccess checks gokrazy's web interface at host: HTTPS with
// the build's certificate and password; port 80 only redirects.
func checkGokrazyAccess(ctx context.Context, t *testing.T, vm *VM, ns *Netns, a access, host string) string {
	t.Helper()
	c := a.gokrazyClient(ns)
	body, err := vm.WaitHTTP(ctx, c, "https://"+host+"/", "gokrazy", a.gokrazyPassword, statusOK)
	if err != nil {
		t.Fatalf("gokrazy over HTTPS: %v", err)
	}
	if _, err := vm.WaitHTTP(ctx, c, "https://"+host+"/", "", "", wantCode(http.StatusUnauthorized)); err != nil {
		t.Errorf("gokrazy without password: %v", err)
	}
	if _, err := vm.WaitHTTP(ctx, c, "http://"+host+"/", "gokrazy", a.gokrazyPassword, func(code int, body string) error {
		if code < 300 || code > 399 {
			return fmt.Errorf("status %d, want a redirect to HTTPS", code)
		}
		return nil
	}); err != nil {
		t.Errorf("gokrazy over plain HTTP: %v", err)
	}
	return body
}

func wantCode(want int) HTTPCheck {
	return func(code int, body string) error {
		if code != want {
			return fmt.Errorf("status %d, want %d", code, want)
		}
		return nil
	}
}
