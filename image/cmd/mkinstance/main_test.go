package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/gateways"
)

// instanceConfig is the part of gokrazy's config.json this test inspects.
type instanceConfig struct {
	Hostname      string
	Update        struct{ Hostname, HTTPPassword, UseTLS, HTTPPort, HTTPSPort string }
	Packages      []string
	PackageConfig map[string]struct {
		CommandLineFlags  []string
		Environment       []string
		ExtraFilePaths    map[string]string
		ExtraFileContents map[string]string
		DontStart         bool
	}
	KernelPackage, FirmwarePackage, EEPROMPackage *string
	SerialConsole                                 string
	KernelExtraArgs                               []string
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func render(t *testing.T, o options) instanceConfig {
	t.Helper()
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(o.instanceDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c instanceConfig
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func baseOptions(t *testing.T) options {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	writeFile(t, filepath.Join(manifests, "svc.yaml"), "kind: Service\n")
	return options{
		templatePath:        "../../config.json.tmpl",
		builddirSrc:         "../../builddir",
		instanceDir:         filepath.Join(dir, "instance"),
		hostname:            "gw1",
		config:              writeFile(t, filepath.Join(dir, "config.toml"), "# demo\n"),
		manifests:           manifests,
		network:             "dhcp",
		passwordFile:        filepath.Join(dir, "secret", "pw.txt"),
		nftgatePasswordFile: filepath.Join(dir, "secret", "nftgate-pw.txt"),
		gokrazyTLSDir:       filepath.Join(dir, "secret", "gokrazy-tls"),
	}
}

func TestRenderDemoInstance(t *testing.T) {
	o := baseOptions(t)
	c := render(t, o)

	if c.Hostname != "gw1" || c.Update.Hostname != "" {
		t.Errorf("Hostname = %q, Update.Hostname = %q", c.Hostname, c.Update.Hostname)
	}
	if c.KernelPackage == nil || *c.KernelPackage != "github.com/gokrazy/kernel.amd64" ||
		c.FirmwarePackage == nil || *c.FirmwarePackage != "github.com/gokrazy/kernel.amd64" ||
		c.EEPROMPackage == nil || *c.EEPROMPackage != "" {
		t.Errorf("kernel/firmware/eeprom packages not set for PC x86-64")
	}
	if c.SerialConsole != "ttyS0,115200" || strings.Join(c.KernelExtraArgs, " ") != "rootdelay=1" {
		t.Errorf("SerialConsole %q, KernelExtraArgs %v", c.SerialConsole, c.KernelExtraArgs)
	}
	pw, err := os.ReadFile(o.passwordFile)
	if err != nil {
		t.Fatalf("password file not created: %v", err)
	}
	if c.Update.HTTPPassword == "" || c.Update.HTTPPassword != strings.TrimSpace(string(pw)) {
		t.Errorf("HTTPPassword %q does not match the password file %q", c.Update.HTTPPassword, pw)
	}

	nftgate := c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"]
	// The listen address comes from the config, never from a flag.
	if got := strings.Join(nftgate.CommandLineFlags, " "); got != "--config /etc/nftgate/config.toml" {
		t.Errorf("nftgate flags = %q", got)
	}
	checkApplianceConfig(t, o, c, "# demo\n", map[string]any{"listen": ":9180", "auth_user": "admin",
		"auth_password_file": "/etc/nftgate/http-password", "tls_self_signed_dir": "/perm/nftgate/tls"})
	if _, ok := nftgate.ExtraFilePaths["/etc/nftgate/kubeconfig"]; ok {
		t.Errorf("kubeconfig installed although none was given")
	}
	for _, e := range nftgate.Environment {
		if strings.HasPrefix(e, "KUBECONFIG=") {
			t.Errorf("KUBECONFIG set although no kubeconfig was given")
		}
	}
	if dhcp := c.PackageConfig["github.com/gokrazy/gokrazy/cmd/dhcp"]; dhcp.DontStart ||
		strings.Join(dhcp.CommandLineFlags, " ") != "-interface=eth0" {
		t.Errorf("dhcp config = %+v, want it running on eth0", dhcp)
	}
	netFile := c.PackageConfig["github.com/nftgate/nftgate/image/cmd/netconfig"].ExtraFilePaths["/etc/nftgate/network.json"]
	if b, err := os.ReadFile(netFile); err != nil || !strings.Contains(string(b), `"dhcp": true`) {
		t.Errorf("network.json %s: %v %s", netFile, err, b)
	}
	if _, err := os.Stat(filepath.Join(o.instanceDir, "builddir/github.com/gokrazy/gokrazy/go.mod")); err != nil {
		t.Errorf("pinned builddir not copied: %v", err)
	}

	// A rebuild keeps the password and the machine ID.
	again := render(t, o)
	if again.Update.HTTPPassword != c.Update.HTTPPassword {
		t.Errorf("password changed across rebuilds")
	}
	machineID := "/etc/machine-id"
	if again.PackageConfig["github.com/gokrazy/gokrazy/cmd/randomd"].ExtraFileContents[machineID] !=
		c.PackageConfig["github.com/gokrazy/gokrazy/cmd/randomd"].ExtraFileContents[machineID] {
		t.Errorf("machine ID changed across rebuilds")
	}
}

func TestRenderStaticNetworkAndKubeconfig(t *testing.T) {
	o := baseOptions(t)
	dir := filepath.Dir(o.config)
	o.kubeconfig = writeFile(t, filepath.Join(dir, "kubeconfig"), "apiVersion: v1\n")
	o.network = writeFile(t, filepath.Join(dir, "network.json"),
		`{"interfaces":[{"name":"eth0","addresses":["192.0.2.10/24"],"routes":[{"to":"0.0.0.0/0","via":"192.0.2.1"}]}]}`)
	o.updateHost = "192.0.2.10"
	c := render(t, o)
	if c.Update.Hostname != "192.0.2.10" {
		t.Errorf("Update.Hostname = %q, want 192.0.2.10", c.Update.Hostname)
	}
	if dhcp := c.PackageConfig["github.com/gokrazy/gokrazy/cmd/dhcp"]; !dhcp.DontStart {
		t.Errorf("dhcp runs although every interface is static")
	}
	nftgate := c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"]
	if nftgate.ExtraFilePaths["/etc/nftgate/kubeconfig"] != o.kubeconfig {
		t.Errorf("kubeconfig source = %q", nftgate.ExtraFilePaths["/etc/nftgate/kubeconfig"])
	}
	if !strings.Contains(strings.Join(nftgate.Environment, " "), "KUBECONFIG=/etc/nftgate/kubeconfig") {
		t.Errorf("Environment %v lacks KUBECONFIG", nftgate.Environment)
	}
}

func TestBadInputsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*options)
		want   string
	}{
		{"missing config", func(o *options) { o.config = "/nonexistent/config.toml" }, "config: stat /nonexistent/config.toml"},
		{"config not TOML", func(o *options) { writeFile(t, o.config, "listen = \n") }, "config "},
		{"tls_cert without key", func(o *options) { o.tlsCert = o.config }, "tls_cert and tls_key go together"},
		{"tls_cert not a certificate", func(o *options) { o.tlsCert, o.tlsKey = o.config, o.config }, "tls_cert"},
		{"manifests not a dir", func(o *options) { o.manifests = o.config }, "manifests: "},
		{"missing kubeconfig", func(o *options) { o.kubeconfig = "/nonexistent/kc" }, "kubeconfig: stat /nonexistent/kc"},
		{"bad hostname", func(o *options) { o.hostname = "gw_1" }, `hostname: "gw_1" is not a valid host name`},
		{"bad network", func(o *options) { o.network = "/nonexistent/network.json" }, "network: open /nonexistent/network.json"},
		{"kernel_dir without vmlinuz", func(o *options) { o.kernelDir = filepath.Dir(o.config) }, "is not a kernel package (make kernel builds one)"},
		{"state sync on the stock kernel", func(o *options) {
			writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/perm/gateways.key\"\n")
		}, "[gateways] state_sync (on by default) needs conntrack events and marks"},
		{"gateways without the key", func(o *options) {
			writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/etc/nftgate/gateways.key\"\nstate_sync = false\n")
		}, "gateways_key_file: must be set"},
		{"gateways key elsewhere on the image", func(o *options) {
			writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/etc/key\"\n")
		}, `gateways.key_file = "/etc/key": on the appliance it must be "/etc/nftgate/gateways.key"`},
		{"gateways key too short", func(o *options) {
			writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/etc/nftgate/gateways.key\"\nstate_sync = false\n")
			o.gatewaysKeyFile = writeFile(t, filepath.Join(filepath.Dir(o.config), "short.key"), "short\n")
		}, "gateways_key_file: gateways.key_file = "},
		{"kernel_dir with the stock path", func(o *options) {
			o.kernelDir = kernelPackage(t, "github.com/gokrazy/kernel.amd64")
		}, "kernel_dir: module github.com/gokrazy/kernel.amd64 of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := baseOptions(t)
			tc.modify(&o)
			err := run(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// kernelPackage writes a directory laid out like the output of make kernel.
func kernelPackage(t *testing.T, module string) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "vmlinuz"), "not really a kernel")
	writeFile(t, filepath.Join(dir, "cmdline.txt"), "root=/dev/sda2 init=/gokrazy/init\n")
	writeFile(t, filepath.Join(dir, "config.txt"), "")
	writeFile(t, filepath.Join(dir, "go.mod"), "module "+module+"\n\ngo 1.22\n")
	writeFile(t, filepath.Join(dir, "kernel.go"), "package kernel\n")
	return dir
}

// With kernel_dir the instance names the local kernel package, and gok's
// way of finding a package's directory (go list in builddir/<package>)
// leads to kernel_dir. The firmware package stays the stock one.
func TestRenderCustomKernel(t *testing.T) {
	o := baseOptions(t)
	o.kernelDir = kernelPackage(t, "github.com/nftgate/kernel.amd64")
	c := render(t, o)
	if c.KernelPackage == nil || *c.KernelPackage != "github.com/nftgate/kernel.amd64" {
		t.Errorf("KernelPackage = %v, want github.com/nftgate/kernel.amd64", c.KernelPackage)
	}
	if c.FirmwarePackage == nil || *c.FirmwarePackage != "github.com/gokrazy/kernel.amd64" {
		t.Errorf("FirmwarePackage = %v, want the stock package", c.FirmwarePackage)
	}
	cmd := exec.Command("go", "list", "-mod=mod", "-f", "{{ .Dir }}", "github.com/nftgate/kernel.amd64")
	cmd.Dir = filepath.Join(o.instanceDir, "builddir", "github.com", "nftgate", "kernel.amd64")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list in the kernel's builddir: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != o.kernelDir {
		t.Errorf("kernel package directory = %q, want %q", got, o.kernelDir)
	}

	// Without kernel_dir the same instance goes back to the stock kernel.
	o.kernelDir = ""
	if c := render(t, o); c.KernelPackage == nil || *c.KernelPackage != "github.com/gokrazy/kernel.amd64" {
		t.Errorf("KernelPackage after switching back = %v, want the stock package", c.KernelPackage)
	}
}

// A config with a [gateways] section whose key_file is the appliance's
// gets the set's key installed there, made once and kept, so that every
// gateway built from the same file shares it; one keeping its key on
// /perm gets none; a config without the section gets none.
func TestRenderGatewaysKey(t *testing.T) {
	o := baseOptions(t)
	o.kernelDir = kernelPackage(t, "github.com/nftgate/kernel.amd64")
	o.gatewaysKeyFile = filepath.Join(filepath.Dir(o.config), "secret", "gateways-key.txt")
	key := func(c instanceConfig) string {
		return c.PackageConfig["github.com/nftgate/nftgate/cmd/nftgate"].ExtraFilePaths["/etc/nftgate/gateways.key"]
	}
	if got := key(render(t, o)); got != "" {
		t.Errorf("without [gateways]: key installed from %q", got)
	}
	if _, err := os.Stat(o.gatewaysKeyFile); err == nil {
		t.Errorf("without [gateways]: %s made", o.gatewaysKeyFile)
	}
	writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/etc/nftgate/gateways.key\"\n")
	if got := key(render(t, o)); got != o.gatewaysKeyFile {
		t.Errorf("key installed from %q, want %q", got, o.gatewaysKeyFile)
	}
	made, err := os.ReadFile(o.gatewaysKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (gateways.Config{KeyFile: o.gatewaysKeyFile}).ReadKey(); err != nil {
		t.Errorf("made key: %v", err)
	}
	render(t, o)
	if again, _ := os.ReadFile(o.gatewaysKeyFile); string(again) != string(made) {
		t.Errorf("a second build changed the key")
	}
	writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/perm/nftgate/gateways.key\"\n")
	if got := key(render(t, o)); got != "" {
		t.Errorf("key_file on /perm: key installed from %q", got)
	}
	// The stock kernel serves a set without state sync.
	o.kernelDir = ""
	writeFile(t, o.config, "[gateways]\nname = \"gw-a\"\nkey_file = \"/etc/nftgate/gateways.key\"\nstate_sync = false\n")
	if got := key(render(t, o)); got != o.gatewaysKeyFile {
		t.Errorf("stock kernel, state_sync = false: key installed from %q, want %q", got, o.gatewaysKeyFile)
	}
}
