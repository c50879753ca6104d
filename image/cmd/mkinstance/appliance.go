package main

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/crypto/bcrypt"

	"github.com/nftgate/nftgate/appliance"
)

// What the appliance gives nftgate when its config.toml does not say.
const (
	applianceListen       = ":9180"
	applianceUser         = "admin"
	appliancePasswordHash = "/etc/nftgate/http-password"
	applianceSelfSigned   = "/perm/nftgate/tls"
	applianceCert         = "/etc/nftgate/tls/cert.pem"
	applianceKey          = "/etc/nftgate/tls/key.pem"
	// applianceGatewaysKey is where the gateway set's shared key goes on
	// the image ([gateways] key_file), from -gateways_key_file.
	applianceGatewaysKey = "/etc/nftgate/gateways.key"
	// applianceKept is the only writable place on the box: a key_file
	// there is the operator's to put, not the build's.
	applianceKept = "/perm/"
)

// nftgateConfig is the config.toml that goes onto the image, and what the
// summary says about it.
type nftgateConfig struct {
	text        []byte
	listen      string
	user        string // "" without authentication
	ourPassword bool   // the password is the one made at build time
	tls         string // how HTTPS is served; "" for plain HTTP
	// gatewaysKey: the config has a [gateways] section whose key_file is
	// applianceGatewaysKey, which the build installs.
	gatewaysKey bool
	// stateSync: the config has a [gateways] section with state sync on
	// (gateways.state_sync, true unless set false).
	stateSync bool
}

// applianceConfig is the user's config.toml with the appliance's values
// added for the keys it does not set (a key set, even to "", is kept).
// haveCert tells whether a certificate was given at build time.
func applianceConfig(path string, haveCert bool) (nftgateConfig, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nftgateConfig{}, fmt.Errorf("config: %w", err)
	}
	var values map[string]any
	md, err := toml.Decode(string(text), &values)
	if err != nil {
		return nftgateConfig{}, fmt.Errorf("config %s: %w", path, err)
	}
	add := map[string]any{}
	if !md.IsDefined("listen") {
		add["listen"] = applianceListen
	}
	if !md.IsDefined("auth_user") && !md.IsDefined("auth_password_file") {
		add["auth_user"], add["auth_password_file"] = applianceUser, appliancePasswordHash
	}
	if !md.IsDefined("tls_cert_file") && !md.IsDefined("tls_key_file") && !md.IsDefined("tls_self_signed_dir") {
		if haveCert {
			add["tls_cert_file"], add["tls_key_file"] = applianceCert, applianceKey
		} else {
			add["tls_self_signed_dir"] = applianceSelfSigned
		}
	}
	get := func(k string) string {
		if v, ok := add[k]; ok {
			return v.(string)
		}
		v, _ := values[k].(string)
		return v
	}
	c := nftgateConfig{text: text, listen: get("listen"), user: get("auth_user"),
		ourPassword: get("auth_password_file") == appliancePasswordHash}
	if md.IsDefined("gateways") {
		// The image's root file system is read-only and built here: the
		// set's key can only be installed by the build, or kept on /perm.
		section, _ := values["gateways"].(map[string]any)
		keyFile, _ := section["key_file"].(string)
		on, set := section["state_sync"].(bool)
		c.stateSync = on || !set
		switch {
		case keyFile == applianceGatewaysKey:
			c.gatewaysKey = true
		case !strings.HasPrefix(keyFile, applianceKept):
			return nftgateConfig{}, fmt.Errorf("config %s: gateways.key_file = %q: on the appliance it must be %q, "+
				"where the build installs the set's key (GATEWAYS_KEY_FILE), or a file under %s", path, keyFile, applianceGatewaysKey, applianceKept)
		}
	}
	switch {
	case get("tls_cert_file") != "":
		c.tls = "certificate " + get("tls_cert_file")
	case get("tls_self_signed_dir") != "":
		c.tls = "self-signed certificate made on the first boot, kept in " + get("tls_self_signed_dir")
	}
	if len(add) > 0 {
		// Before the operator's text: after a table ([bgp], [[pools]],
		// [l2]) a key would belong to that table, and TOML has no way
		// back to the top level.
		var b bytes.Buffer
		b.WriteString("# Added for the appliance by image/cmd/mkinstance: keys the file below does not set.\n")
		if err := toml.NewEncoder(&b).Encode(add); err != nil {
			return nftgateConfig{}, err
		}
		b.WriteString("\n# The operator's config.toml:\n")
		b.Write(text)
		c.text = b.Bytes()
	}
	return c, nil
}

// open reports whether the status server listens beyond loopback.
func (c nftgateConfig) open() bool {
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil || host == "localhost" {
		return false
	}
	a, err := netip.ParseAddr(host)
	return host == "" || err != nil || !a.IsLoopback()
}

// writeBcrypt writes the bcrypt hash of password to path, keeping a hash
// already there that matches it, so that rebuilds leave the file alone.
func writeBcrypt(path, password string) error {
	if old, err := os.ReadFile(path); err == nil && bcrypt.CompareHashAndPassword(bytes.TrimSpace(old), []byte(password)) == nil {
		return nil
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(hash, '\n'), 0o600)
}

// gokrazyCert is the certificate of gokrazy's web interface.
type gokrazyCert struct {
	certPath, keyPath, sha256 string
}

// gokrazyCertificate returns the certificate kept in dir for gokrazy's web
// interface and update endpoint, making it for hostname and updateHost the
// first time. A kept certificate must name both: gok update checks the
// name it connects to.
func gokrazyCertificate(dir, hostname, updateHost string) (gokrazyCert, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return gokrazyCert{}, err
	}
	names := []string{hostname}
	if updateHost != "" {
		names = append(names, updateHost)
	}
	cert, _, err := appliance.SelfSignedCertificate(dir, names, time.Now())
	if err != nil {
		return gokrazyCert{}, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return gokrazyCert{}, err
	}
	for _, n := range names {
		if err := leaf.VerifyHostname(n); err != nil {
			return gokrazyCert{}, fmt.Errorf("%s was made for %s, not for %q, which gok update would connect to: "+
				"remove the directory to make a new certificate (a box running the old one then needs `make image` written to it again)",
				filepath.Join(dir, appliance.SelfSignedCertFile), strings.Join(append(leaf.DNSNames, ipStrings(leaf.IPAddresses)...), ", "), n)
		}
	}
	return gokrazyCert{
		certPath: filepath.Join(dir, appliance.SelfSignedCertFile),
		keyPath:  filepath.Join(dir, appliance.SelfSignedKeyFile),
		sha256:   appliance.CertificateSHA256(cert),
	}, nil
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// accessSummary is what `make image` prints at its end: where the box
// answers, and with which credentials.
func accessSummary(host, gokrazyPassword, gokrazyPasswordFile string, gc gokrazyCert,
	nftgatePassword, nftgatePasswordFile string, nc nftgateConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gokrazy web interface and updates: https://%s/  user gokrazy, password %s (%s)\n", host, gokrazyPassword, gokrazyPasswordFile)
	fmt.Fprintf(&b, "  certificate %s, SHA-256 %s\n", gc.certPath, gc.sha256)
	if nc.listen == "" {
		b.WriteString("nftgate status page: off (listen = \"\")\n")
		return b.String()
	}
	scheme := "http"
	if nc.tls != "" {
		scheme = "https"
	}
	_, port, _ := net.SplitHostPort(nc.listen)
	fmt.Fprintf(&b, "nftgate status page: %s://%s/", scheme, net.JoinHostPort(host, port))
	switch {
	case nc.user == "":
		b.WriteString("  no authentication")
	case nc.ourPassword:
		fmt.Fprintf(&b, "  user %s, password %s (%s)", nc.user, nftgatePassword, nftgatePasswordFile)
	default:
		fmt.Fprintf(&b, "  user %s, password from the config's auth_password_file", nc.user)
	}
	b.WriteString("\n")
	if nc.tls != "" {
		fmt.Fprintf(&b, "  %s\n", nc.tls)
	}
	if nc.open() && (nc.user == "" || nc.tls == "") {
		fmt.Fprintf(&b, "WARNING: nftgate's status page listens on %q without authentication or without TLS\n", nc.listen)
	}
	return b.String()
}
