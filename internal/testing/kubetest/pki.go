package kubetest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Names of the identities the control plane is set up with.
const (
	// AdminUser is the user name of the admin client certificate. It is in
	// the system:masters group, which RBAC lets do anything.
	AdminUser = "kubetest-admin"
	// ServiceAccountIssuer is the issuer of service account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
)

// pki holds the files kube-apiserver is started with and the PEM data
// clients need. Everything is generated per control plane, so no two test
// runs trust each other.
type pki struct {
	caCertPEM     []byte
	adminCertPEM  []byte
	adminKeyPEM   []byte
	caCertFile    string
	serveCertFile string
	serveKeyFile  string
	saKeyFile     string
}

// newPKI writes a CA, a serving certificate for the given addresses, an
// admin client certificate and a service account signing key into dir.
func newPKI(dir string, serveIPs []net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now()
	// Valid from a little in the past, so that a clock step during a test
	// does not make the certificates not yet valid.
	notBefore := now.Add(-time.Hour)
	notAfter := now.Add(24 * time.Hour * 365)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "kubetest-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caCert, caDER, err := signCert(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}

	serveKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serveTmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: serveIPs,
		// The names in-cluster clients use for the API server.
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	}
	_, serveDER, err := signCert(serveTmpl, caCert, serveKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}

	adminKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	adminTmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: AdminUser, Organization: []string{"system:masters"}},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	_, adminDER, err := signCert(adminTmpl, caCert, adminKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}

	p := &pki{
		caCertPEM:     pemCert(caDER),
		adminCertPEM:  pemCert(adminDER),
		caCertFile:    filepath.Join(dir, "ca.crt"),
		serveCertFile: filepath.Join(dir, "apiserver.crt"),
		serveKeyFile:  filepath.Join(dir, "apiserver.key"),
		saKeyFile:     filepath.Join(dir, "sa.key"),
	}
	if p.adminKeyPEM, err = pemKey(adminKey); err != nil {
		return nil, err
	}
	serveKeyPEM, err := pemKey(serveKey)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := pemKey(saKey)
	if err != nil {
		return nil, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{p.caCertFile, p.caCertPEM},
		// The chain lets clients that only know the CA verify the server.
		{p.serveCertFile, append(pemCert(serveDER), p.caCertPEM...)},
		{p.serveKeyFile, serveKeyPEM},
		{p.saKeyFile, saKeyPEM},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func signCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, der, err
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
