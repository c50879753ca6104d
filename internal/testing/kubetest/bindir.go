package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

// EnvBinDir names the environment variable that points at a directory
// holding kube-apiserver (and kube-proxy), overriding the repository's
// build directory.
const EnvBinDir = "NFTGATE_KUBE_BIN"

// DefaultEtcd is Debian's etcd (package etcd-server, `make kube-deps`).
const DefaultEtcd = "/usr/bin/etcd"

// ErrBinariesMissing is wrapped by the errors of BinDir and Start when
// kube-apiserver or etcd is not installed, so tests can tell a machine that
// was not set up from a control plane that failed.
var ErrBinariesMissing = errors.New("kubernetes binaries missing")

// BinDir returns the directory that holds the kube-apiserver binary: $NFTGATE_KUBE_BIN
// when set, else the build/ directory of this repository (found from the
// working directory, or from this source file's location). The error says
// how to build the binaries when they are missing.
func BinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if err := checkBin(dir, "kube-apiserver"); err != nil {
			return "", fmt.Errorf("kubetest: %s=%s: %w (run `make kube-apiserver` and point %s at its output)",
				EnvBinDir, dir, err, EnvBinDir)
		}
		return dir, nil
	}
	root, err := repo.Root()
	if err != nil {
		return "", fmt.Errorf("kubetest: %w: cannot find the nftgate repository to look for build/kube-apiserver (%v); set %s",
			ErrBinariesMissing, err, EnvBinDir)
	}
	dir := filepath.Join(root, "build")
	if err := checkBin(dir, "kube-apiserver"); err != nil {
		return "", fmt.Errorf("kubetest: %w; run `make kube-apiserver` in %s (or set %s)", err, root, EnvBinDir)
	}
	return dir, nil
}

func checkBin(dir, name string) error {
	p := filepath.Join(dir, name)
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: %s not found", ErrBinariesMissing, p)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: %s is not an executable file", ErrBinariesMissing, p)
	}
	return nil
}

// lookEtcd checks that the etcd binary exists.
func lookEtcd(path string) (string, error) {
	p, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("kubetest: %w: etcd %s: %v; run `make kube-deps` (Debian package etcd-server)",
			ErrBinariesMissing, path, err)
	}
	return p, nil
}

// KubeProxy returns the path of the kube-proxy binary built next to
// kube-apiserver, for side-by-side comparisons.
func KubeProxy() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	if err := checkBin(dir, "kube-proxy"); err != nil {
		return "", fmt.Errorf("kubetest: %w; run `make kube-bin`", err)
	}
	return filepath.Join(dir, "kube-proxy"), nil
}
