package main

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/crypto/bcrypt"

	"github.com/nftgate/nftgate/appliance"
)

// checkApplianceConfig checks the config.toml that goes onto the image:
// exactly the keys of added, then the user's text.
func checkApplianceConfig(t *testing.T, o options, c instanceConfig, userText string, added map[string]any) {
	t.Helper()
	nftgate := c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"]
	src := nftgate.ExtraFilePaths["/etc/nftgate/config.toml"]
	if want := filepath.Join(o.instanceDir, "nftgate-config.toml"); src != want {
		t.Fatalf("config.toml source = %q, want %q", src, want)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), userText) {
		t.Errorf("the image's config.toml does not end with the user's:\n%s", b)
	}
	var user, all map[string]any
	if _, err := toml.Decode(userText, &user); err != nil {
		t.Fatal(err)
	}
	if _, err := toml.Decode(string(b), &all); err != nil {
		t.Fatalf("the image's config.toml: %v\n%s", err, b)
	}
	for k := range user {
		delete(all, k)
	}
	if len(all) == 0 {
		all = map[string]any{}
	}
	if !reflect.DeepEqual(all, added) {
		t.Errorf("keys added to the config: %v, want %v", all, added)
	}

	// The status page password: made once, its bcrypt hash on the image.
	pw, err := os.ReadFile(o.nftgatePasswordFile)
	if err != nil {
		t.Fatalf("nftgate password file: %v", err)
	}
	hash, err := os.ReadFile(nftgate.ExtraFilePaths["/etc/nftgate/http-password"])
	if err != nil {
		t.Fatal(err)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(strings.TrimSpace(string(hash))), []byte(strings.TrimSpace(string(pw)))); err != nil {
		t.Errorf("/etc/nftgate/http-password is not the hash of %s: %v", o.nftgatePasswordFile, err)
	}

	// gokrazy serves HTTPS with a certificate made for the host name and
	// the update address, which gok update trusts.
	parts := strings.Split(c.Update.UseTLS, ",")
	if len(parts) != 2 || c.Update.HTTPSPort != "443" || c.Update.HTTPPort != "80" {
		t.Fatalf("Update: UseTLS %q, ports %q/%q", c.Update.UseTLS, c.Update.HTTPPort, c.Update.HTTPSPort)
	}
	cert, err := tls.LoadX509KeyPair(parts[0], parts[1])
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{o.hostname, o.updateHost} {
		if n != "" {
			if err := leaf.VerifyHostname(n); err != nil {
				t.Errorf("gokrazy's certificate: %v", err)
			}
		}
	}
	access, err := os.ReadFile(filepath.Join(o.instanceDir, "access.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(access), "password "+c.Update.HTTPPassword) || !strings.Contains(string(access), appliance.CertificateSHA256(cert)) {
		t.Errorf("access.txt lacks gokrazy's password or certificate:\n%s", access)
	}
	if added["auth_user"] != nil && !strings.Contains(string(access), "password "+strings.TrimSpace(string(pw))) {
		t.Errorf("access.txt lacks the status page's password:\n%s", access)
	}
}

// A config that sets the keys keeps them, even empty; a certificate given
// at build time is installed and named.
func TestUserConfigWins(t *testing.T) {
	o := baseOptions(t)
	dir := filepath.Dir(o.config)
	text := "listen = \"10.0.0.1:8443\"\nauth_user = \"\"\nauth_password_file = \"\"\n"
	writeFile(t, o.config, text)
	certPEM, keyPEM := filepath.Join(dir, "given", appliance.SelfSignedCertFile), filepath.Join(dir, "given", appliance.SelfSignedKeyFile)
	if _, _, err := appliance.SelfSignedCertificate(filepath.Dir(certPEM), []string{"gw1"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	o.tlsCert, o.tlsKey = certPEM, keyPEM
	c := render(t, o)
	checkApplianceConfig(t, o, c, text, map[string]any{"tls_cert_file": "/etc/nftgate/tls/cert.pem", "tls_key_file": "/etc/nftgate/tls/key.pem"})
	paths := c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"].ExtraFilePaths
	if paths["/etc/nftgate/tls/cert.pem"] != certPEM || paths["/etc/nftgate/tls/key.pem"] != keyPEM {
		t.Errorf("certificate not installed: %v", paths)
	}
	access, _ := os.ReadFile(filepath.Join(o.instanceDir, "access.txt"))
	if !strings.Contains(string(access), "https://gw1:8443/  no authentication") || !strings.Contains(string(access), "WARNING") {
		t.Errorf("access.txt:\n%s", access)
	}

	text = "listen = \"127.0.0.1:9180\"\ntls_self_signed_dir = \"\"\n"
	writeFile(t, o.config, text)
	o.tlsCert, o.tlsKey = "", ""
	c = render(t, o)
	checkApplianceConfig(t, o, c, text, map[string]any{"auth_user": "admin", "auth_password_file": "/etc/nftgate/http-password"})
}

// A config with tables (the edge: [bgp], [[pools]]) gets the appliance's
// keys at the top level, and its tables stay as they were.
func TestConfigWithTables(t *testing.T) {
	o := baseOptions(t)
	text := `cluster_cidrs = ["10.0.0.0/8"]

[bgp]
asn = 64513
router_id = "192.0.2.1"

[[bgp.peer]]
address = "192.0.2.254"
asn = 64512

[[pools]]
name = "public"
addresses = ["198.51.100.0/28"]
`
	writeFile(t, o.config, text)
	c := render(t, o)
	checkApplianceConfig(t, o, c, text, map[string]any{"listen": ":9180", "auth_user": "admin",
		"auth_password_file": "/etc/nftgate/http-password", "tls_self_signed_dir": "/perm/nftgate/tls"})
	b, err := os.ReadFile(c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"].ExtraFilePaths["/etc/nftgate/config.toml"])
	if err != nil {
		t.Fatal(err)
	}
	var all struct {
		BGP struct {
			ASN  int              `toml:"asn"`
			Peer []map[string]any `toml:"peer"`
		} `toml:"bgp"`
		Pools []map[string]any `toml:"pools"`
	}
	if _, err := toml.Decode(string(b), &all); err != nil {
		t.Fatal(err)
	}
	if all.BGP.ASN != 64513 || len(all.BGP.Peer) != 1 || len(all.Pools) != 1 || all.Pools[0]["name"] != "public" {
		t.Errorf("tables after the build: %+v\n%s", all, b)
	}
}

// gokrazy's certificate is made once and kept across rebuilds; one that
// does not name the update address is an error saying so.
func TestGokrazyCertificateIsKept(t *testing.T) {
	o := baseOptions(t)
	o.updateHost = "192.0.2.10"
	c := render(t, o)
	first, _ := os.ReadFile(strings.Split(c.Update.UseTLS, ",")[0])
	c = render(t, o)
	again, _ := os.ReadFile(strings.Split(c.Update.UseTLS, ",")[0])
	if string(first) != string(again) {
		t.Error("gokrazy's certificate changed across rebuilds")
	}
	pwHash := c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"].ExtraFilePaths["/etc/nftgate/http-password"]
	st1, _ := os.Stat(pwHash)
	render(t, o)
	if st2, _ := os.Stat(pwHash); !st1.ModTime().Equal(st2.ModTime()) {
		t.Error("the password hash was rewritten although the password did not change")
	}
	o.updateHost = "192.0.2.99"
	if err := run(o); err == nil || !strings.Contains(err.Error(), `not for "192.0.2.99"`) || !strings.Contains(err.Error(), "gokrazy_tls_dir") {
		t.Errorf("certificate without the new update host: %v", err)
	}
}
