//go:build customkernel

// TestApplianceVLAN needs the image with the kernel of `make kernel`, whose
// build takes tens of minutes; `make vmtest-vlan` builds both and runs it
// with the build tag customkernel. Without the tag this file is not
// compiled, so `make test` neither runs nor skips it.

package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

// The VLAN of testdata/network-vlan.json: eth1.100 on the VM's eth1.
const (
	vlanID         = 100
	vmVLANAddr     = "10.123.100.1"
	vlanClientAddr = "10.123.100.2/24"
)

var releaseLine = regexp.MustCompile(`(?m)^[0-9]+\.[0-9]+\.[0-9]+\S*$`)

// Options the custom kernel adds to the stock gokrazy kernel
// (image/kernel/config.fragment).
var customKernelOptions = []string{
	"CONFIG_VLAN_8021Q", "CONFIG_NFT_NUMGEN", "CONFIG_NF_CONNTRACK_MARK",
	"CONFIG_NF_CONNTRACK_EVENTS", "CONFIG_DUMMY",
}

// TestApplianceVLAN boots the image built with the custom kernel and the
// network of network-vlan.json, checks the kernel's options, that netconfig
// created the VLAN interface, and that a namespace reaches the VM's VLAN
// address only through frames tagged with VLAN 100 on the VM's eth1 (the
// relay VLANTrunk tags them; the host kernel has no 802.1Q of its own).
func TestApplianceVLAN(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("qemu-system-x86_64 not installed (make vmtest-deps installs it): %v", err)
	}
	image := os.Getenv("NFTGATE_VMTEST_VLAN_IMAGE")
	if image == "" {
		t.Fatal("NFTGATE_VMTEST_VLAN_IMAGE is not set: run make vmtest-vlan, which builds the kernel and the image")
	}
	root := repo.Path(t)
	acc := loadAccess(t, root)

	client := newNetns(t, "client")
	trunk := newNetns(t, "trunk")
	vlanClient := newNetns(t, "vlan")
	var relay *VLANTrunk
	closeRelay := func() {
		if relay != nil {
			if err := relay.Close(); err != nil {
				t.Errorf("VLAN relay: %v", err)
			}
			relay = nil
		}
	}
	// For a failed boot; once the VM runs, the relay is closed before
	// the VM stops (below), as its trunk tap goes away with QEMU.
	t.Cleanup(closeRelay)
	vm := startVM(t, Config{
		Image: image,
		NICs: []NIC{
			{Netns: client, Tap: "vm-eth0", MAC: "52:54:00:12:01:01"},
			{Netns: trunk, Tap: "vm-eth1", MAC: "52:54:00:12:02:01"},
		},
	}, func() error {
		// Each boot attempt has a new tap for eth1, so the relay and
		// its access tap start over with it.
		if relay != nil {
			relay.Close()
			relay = nil
		}
		if err := client.AddrAdd("vm-eth0", clientAddr); err != nil {
			return err
		}
		r, err := StartVLANTrunk(vlanClient, "vlan-client", trunk, "vm-eth1", vlanID)
		if err != nil {
			return err
		}
		relay = r
		return vlanClient.AddrAdd("vlan-client", vlanClientAddr)
	})
	t.Cleanup(closeRelay)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	checkGokrazyAccess(ctx, t, vm, client, acc, vmClientAddr)
	t.Logf("gokrazy web interface answered %.1f s after QEMU started", time.Since(vm.Started).Seconds())

	// The console also carries gokrazy's log lines; the release is the
	// line that looks like one.
	out, err := vm.Shell(ctx, "uname -r")
	if err != nil {
		t.Fatal(err)
	}
	release := releaseLine.FindString(out)
	if !strings.HasSuffix(release, "-nftgate") {
		t.Errorf("uname -r printed %q, want the custom kernel's release (…-nftgate)", out)
	}
	out, err = vm.Shell(ctx, `zcat /proc/config.gz | grep -E '^(# )?CONFIG_(VLAN_8021Q|NFT_NUMGEN|NF_CONNTRACK_MARK|NF_CONNTRACK_EVENTS|DUMMY|MODULES)[ =]'`)
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]string{}
	for _, m := range configLine.FindAllStringSubmatch(out, -1) {
		if m[1] != "" {
			opts[m[1]] = m[2]
		} else {
			opts[m[3]] = "n"
		}
	}
	t.Logf("kernel %s, options: %v", release, opts)
	for _, o := range customKernelOptions {
		if v := opts[o]; v != "y" {
			t.Errorf("kernel option %s = %q on the image, want y", o, v)
		}
	}

	// The kernel's own list of VLAN devices: netconfig made eth1.100
	// with id 100 on eth1.
	vlans, err := vm.Shell(ctx, "cat /proc/net/vlan/config")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(vlans), " "), fmt.Sprintf("eth1.%d | %d | eth1", vlanID, vlanID)) {
		t.Errorf("/proc/net/vlan/config lacks eth1.%d on eth1:\n%s", vlanID, vlans)
	}

	// nftgate's status API on the VLAN address, from the namespace whose
	// only way to the VM is the tagged trunk.
	vlanStatus := net.JoinHostPort(vmVLANAddr, "9180")
	pinned, _ := pinStatusCertificate(ctx, t, vm, vlanClient, vlanStatus)
	if _, err := vm.WaitHTTP(ctx, pinned, "https://"+vlanStatus+"/api/v1/status", "admin", acc.nftgatePassword, func(code int, body string) error {
		var st statusJSON
		if code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		if !st.Sync.FirstSyncDone {
			return fmt.Errorf("firstSyncDone %v", st.Sync.FirstSyncDone)
		}
		return nil
	}); err != nil {
		t.Fatalf("nftgate over VLAN %d: %v", vlanID, err)
	}
	tagged, untagged := relay.Tagged.Load(), relay.Untagged.Load()
	t.Logf("VLAN %d: %d frames tagged towards the VM, %d untagged from it; %.1f s after QEMU started",
		vlanID, tagged, untagged, time.Since(vm.Started).Seconds())
	if tagged == 0 || untagged == 0 {
		t.Errorf("no frames relayed through VLAN %d (tagged %d, untagged %d)", vlanID, tagged, untagged)
	}
}
