// Command mkinstance renders the gokrazy instance of the nftgate appliance
// from image/config.json.tmpl. The files that differ per installation (the
// nftgate config, kubeconfig, manifests, network settings, passwords and
// certificates) are referenced from where the user keeps them, or made once
// into the build directory, and never committed to the repository.
//
// The appliance is safe by default: nftgate's config.toml gets, for each
// of the keys below that it does not set, the appliance's value: listen on
// every address, basic authentication with a password made at build time
// (its bcrypt hash goes onto the image), and HTTPS with a certificate given
// at build time or made on the first boot and kept on /perm. gokrazy's web
// interface and update endpoint serve HTTPS with a certificate made at
// build time for the host name and the update address, which `gok update`
// trusts.
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/image/network"
)

// params are the values the template sees.
type params struct {
	Hostname       string
	UpdateHost     string
	HTTPPassword   string
	MachineID      string
	ConfigFile     string
	KubeconfigFile string
	ManifestsDir   string
	NetworkFile    string
	DHCPInterface  string
	// KernelPackage is the Go package gok takes vmlinuz and cmdline.txt
	// from: the stock gokrazy kernel, or the module of -kernel_dir.
	KernelPackage string
	// GokrazyTLS is gokrazy's Update.UseTLS: "cert.pem,key.pem".
	GokrazyTLS string
	// NftgatePasswordHash is the file installed as the bcrypt hash of
	// nftgate's status page password; NftgateCert and NftgateKey the
	// certificate given at build time (empty: none).
	NftgatePasswordHash     string
	NftgateCert, NftgateKey string
	// GatewaysKey is the file installed as the gateway set's shared key
	// (empty: none).
	GatewaysKey string
	// OnBox are the paths those files are installed at.
	OnBox struct{ PasswordHash, Cert, Key, GatewaysKey string }
}

// stockKernel is the kernel package pinned in image/builddir.
const stockKernel = "github.com/gokrazy/kernel.amd64"

type options struct {
	templatePath string
	instanceDir  string
	builddirSrc  string
	hostname     string
	updateHost   string
	config       string
	kubeconfig   string
	manifests    string
	network      string
	passwordFile string
	kernelDir    string
	// nftgatePasswordFile holds the status page password (made when
	// missing); gokrazyTLSDir gokrazy's certificate (made when missing);
	// tlsCert and tlsKey nftgate's certificate given at build time.
	nftgatePasswordFile string
	gokrazyTLSDir       string
	tlsCert, tlsKey     string
	// gatewaysKeyFile holds the gateway set's shared key (made when
	// missing), installed when the config has a [gateways] section.
	gatewaysKeyFile string
}

func main() {
	var o options
	flag.StringVar(&o.templatePath, "template", "image/config.json.tmpl", "instance config template")
	flag.StringVar(&o.instanceDir, "instance_dir", "build/gokrazy/nftgate", "gokrazy instance directory to write (parent_dir/instance)")
	flag.StringVar(&o.builddirSrc, "builddir", "image/builddir", "pinned gokrazy builddir (go.mod/go.sum per package) copied into the instance")
	flag.StringVar(&o.hostname, "hostname", "nftgate", "hostname of the appliance")
	flag.StringVar(&o.updateHost, "update_host", "", "address gok update reaches the appliance at (default: its host name)")
	flag.StringVar(&o.config, "config", "", "nftgate config.toml to install as /etc/nftgate/config.toml")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig to install as /etc/nftgate/kubeconfig (empty: none, nftgate reads the manifests)")
	flag.StringVar(&o.manifests, "manifests", "", "directory installed as /etc/nftgate/manifests")
	flag.StringVar(&o.network, "network", "dhcp", `"dhcp" (DHCP on eth0) or a network.json file`)
	flag.StringVar(&o.passwordFile, "password_file", "", "file holding the gokrazy web interface password; created with a random password when missing")
	flag.StringVar(&o.kernelDir, "kernel_dir", "", "local gokrazy kernel package (make kernel: build/kernel/pkg) used instead of the stock kernel; empty: stock")
	flag.StringVar(&o.nftgatePasswordFile, "nftgate_password_file", "", "file holding the password of nftgate's status page (user "+applianceUser+"); created with a random password when missing")
	flag.StringVar(&o.gokrazyTLSDir, "gokrazy_tls_dir", "", "directory keeping the certificate of gokrazy's web interface and update endpoint (cert.pem, key.pem); made when missing")
	flag.StringVar(&o.tlsCert, "tls_cert", "", "certificate (PEM) of nftgate's status page; empty: one made on the box's first boot and kept on /perm")
	flag.StringVar(&o.tlsKey, "tls_key", "", "key (PEM) of -tls_cert")
	flag.StringVar(&o.gatewaysKeyFile, "gateways_key_file", "", "file holding the shared key of the gateway set, installed as "+applianceGatewaysKey+
		" when the config has a [gateways] section naming it as key_file; created with a random key when missing (give every gateway of the set the same file)")
	flag.Parse()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)

func run(o options) error {
	if !hostnameRE.MatchString(o.hostname) {
		return fmt.Errorf("hostname: %q is not a valid host name (letters, digits and inner hyphens, at most 63)", o.hostname)
	}
	if o.passwordFile == "" {
		return errors.New("password_file: must be set")
	}
	if o.nftgatePasswordFile == "" {
		return errors.New("nftgate_password_file: must be set")
	}
	if o.gokrazyTLSDir == "" {
		return errors.New("gokrazy_tls_dir: must be set")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return errors.New("tls_cert: tls_cert and tls_key go together")
	}
	p := params{Hostname: o.hostname, UpdateHost: o.updateHost}
	p.OnBox.PasswordHash, p.OnBox.Cert, p.OnBox.Key = appliancePasswordHash, applianceCert, applianceKey
	p.OnBox.GatewaysKey = applianceGatewaysKey
	var err error
	userConfig, err := absFile("config", o.config, false)
	if err != nil {
		return err
	}
	if o.tlsCert != "" {
		if p.NftgateCert, err = absFile("tls_cert", o.tlsCert, false); err != nil {
			return err
		}
		if p.NftgateKey, err = absFile("tls_key", o.tlsKey, false); err != nil {
			return err
		}
		if _, err := tls.LoadX509KeyPair(p.NftgateCert, p.NftgateKey); err != nil {
			return fmt.Errorf("tls_cert %q, tls_key %q: %w", o.tlsCert, o.tlsKey, err)
		}
	}
	if o.kubeconfig != "" {
		if p.KubeconfigFile, err = absFile("kubeconfig", o.kubeconfig, false); err != nil {
			return err
		}
	}
	if p.ManifestsDir, err = absFile("manifests", o.manifests, true); err != nil {
		return err
	}

	netcfg := network.DHCPConfig()
	if o.network != "dhcp" {
		if netcfg, err = network.Load(o.network); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	p.DHCPInterface = netcfg.DHCPInterface()

	if err := os.MkdirAll(o.instanceDir, 0o755); err != nil {
		return err
	}
	instanceDir, err := filepath.Abs(o.instanceDir)
	if err != nil {
		return err
	}
	// The validated configuration is what goes onto the image, so the
	// appliance never sees a file that did not pass Validate.
	netJSON, err := json.MarshalIndent(netcfg, "", "  ")
	if err != nil {
		return err
	}
	p.NetworkFile = filepath.Join(instanceDir, "network.json")
	if err := writeIfChanged(p.NetworkFile, append(netJSON, '\n'), 0o644); err != nil {
		return err
	}

	if p.HTTPPassword, err = readOrCreateSecret(o.passwordFile, 10); err != nil {
		return fmt.Errorf("password_file: %w", err)
	}
	nftgatePassword, err := readOrCreateSecret(o.nftgatePasswordFile, 10)
	if err != nil {
		return fmt.Errorf("nftgate_password_file: %w", err)
	}
	p.NftgatePasswordHash = filepath.Join(instanceDir, "nftgate-password.bcrypt")
	if err := writeBcrypt(p.NftgatePasswordHash, nftgatePassword); err != nil {
		return fmt.Errorf("nftgate_password_file: %w", err)
	}
	nc, err := applianceConfig(userConfig, p.NftgateCert != "")
	if err != nil {
		return err
	}
	if nc.gatewaysKey {
		if o.gatewaysKeyFile == "" {
			return fmt.Errorf("gateways_key_file: must be set: config %s has a [gateways] section whose key_file is %s", userConfig, applianceGatewaysKey)
		}
		// Random bytes in hex: twice as long as a key must be.
		if _, err := readOrCreateSecret(o.gatewaysKeyFile, gateways.MinKeyLen); err != nil {
			return fmt.Errorf("gateways_key_file: %w", err)
		}
		if _, err := (gateways.Config{KeyFile: o.gatewaysKeyFile}).ReadKey(); err != nil {
			return fmt.Errorf("gateways_key_file: %w", err)
		}
		if p.GatewaysKey, err = filepath.Abs(o.gatewaysKeyFile); err != nil {
			return err
		}
	}
	p.ConfigFile = filepath.Join(instanceDir, "nftgate-config.toml")
	if err := writeIfChanged(p.ConfigFile, nc.text, 0o644); err != nil {
		return err
	}
	gokrazyCert, err := gokrazyCertificate(o.gokrazyTLSDir, o.hostname, o.updateHost)
	if err != nil {
		return fmt.Errorf("gokrazy_tls_dir: %w", err)
	}
	p.GokrazyTLS = gokrazyCert.certPath + "," + gokrazyCert.keyPath
	// One machine ID per instance directory, kept across rebuilds so that
	// an update does not turn the box into a different machine.
	if p.MachineID, err = readOrCreateSecret(filepath.Join(instanceDir, "machine-id"), 16); err != nil {
		return err
	}
	p.MachineID += "\n"

	if err := copyTree(o.builddirSrc, filepath.Join(instanceDir, "builddir")); err != nil {
		return fmt.Errorf("builddir: %w", err)
	}
	p.KernelPackage = stockKernel
	if nc.stateSync && o.kernelDir == "" {
		// nftgate would stop on the box at every start, naming the
		// options (statesync.CheckConntrackKernel).
		return fmt.Errorf("config %s: [gateways] state_sync (on by default) needs conntrack events and marks "+
			"(CONFIG_NF_CONNTRACK_EVENTS, CONFIG_NF_CONNTRACK_MARK), which the stock kernel %s lacks: "+
			"build with KERNEL=custom (make kernel), or set gateways.state_sync = false", userConfig, stockKernel)
	}
	if o.kernelDir != "" {
		if p.KernelPackage, err = localKernel(o.kernelDir, filepath.Join(instanceDir, "builddir")); err != nil {
			return err
		}
	}

	tmpl, err := template.New(filepath.Base(o.templatePath)).Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
	}).ParseFiles(o.templatePath)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, p); err != nil {
		return err
	}
	// Catch a template that renders broken JSON here, not inside gok.
	var check map[string]any
	if err := json.Unmarshal(buf.Bytes(), &check); err != nil {
		return fmt.Errorf("%s rendered invalid JSON: %w\n%s", o.templatePath, err, buf.String())
	}
	if err := writeIfChanged(filepath.Join(instanceDir, "config.json"), buf.Bytes(), 0o600); err != nil {
		return err
	}
	host := o.hostname
	if o.updateHost != "" {
		host = o.updateHost
	}
	return writeIfChanged(filepath.Join(instanceDir, "access.txt"), []byte(accessSummary(host, p.HTTPPassword, o.passwordFile,
		gokrazyCert, nftgatePassword, o.nftgatePasswordFile, nc)), 0o600)
}

// localKernel points the instance at the kernel package in dir: gok finds
// a package's directory with `go list` in builddir/<package path>, so a
// go.mod there that requires the package's module and replaces it with
// dir makes gok read vmlinuz from dir. gok reads cmdline.txt and config.txt
// (the Raspberry Pi's, empty here) too and fails without them. It returns
// the package path.
func localKernel(dir, builddir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for _, f := range []string{"vmlinuz", "cmdline.txt", "config.txt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("kernel_dir: %q is not a kernel package (make kernel builds one): %w", dir, err)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("kernel_dir: %w", err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)\s*$`).FindSubmatch(gomod)
	if m == nil {
		return "", fmt.Errorf("kernel_dir: %s has no module line", filepath.Join(dir, "go.mod"))
	}
	module := string(m[1])
	if module == stockKernel {
		return "", fmt.Errorf("kernel_dir: module %s of %q is the stock kernel's path; a local kernel needs its own", module, dir)
	}
	content := fmt.Sprintf("module gokrazy/build/kernel\n\ngo 1.22\n\nrequire %s v0.0.0-00010101000000-000000000000\n\nreplace %s => %s\n", module, module, dir)
	modDir := filepath.Join(builddir, filepath.FromSlash(module))
	if err := os.MkdirAll(modDir, 0o755); err != nil {
		return "", err
	}
	if err := writeIfChanged(filepath.Join(modDir, "go.mod"), []byte(content), 0o644); err != nil {
		return "", err
	}
	return module, nil
}

// absFile checks that path names an existing file (or directory) and makes
// it absolute: gok resolves ExtraFilePaths relative to the instance
// directory, not to where make runs.
func absFile(field, path string, dir bool) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s: must be set", field)
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", field, err)
	}
	if dir && !st.IsDir() {
		return "", fmt.Errorf("%s: %q is not a directory", field, path)
	}
	if !dir && !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s: %q is not a regular file", field, path)
	}
	return filepath.Abs(path)
}

// readOrCreateSecret returns the first line of path, creating the file with
// nbytes random bytes in hex when it does not exist.
func readOrCreateSecret(path string, nbytes int) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		if s == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	r := make([]byte, nbytes)
	if _, err := rand.Read(r); err != nil {
		return "", err
	}
	s := hex.EncodeToString(r)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return s, os.WriteFile(path, []byte(s+"\n"), 0o600)
}

// writeIfChanged leaves an unchanged file alone so that its mtime, which
// gok reports and make compares, only moves when the content does.
func writeIfChanged(path string, b []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	return os.WriteFile(path, b, mode)
}

// copyTree copies the regular files below src into dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return writeIfChanged(target, b, 0o644)
	})
}
