// Command netconfig applies the nftgate appliance's network settings
// (/etc/nftgate/network.json) once at boot: forwarding sysctls, static
// addresses and routes. gokrazy starts it like any other program; it exits
// with status 125 on success so that gokrazy does not restart it, and with
// status 1 on failure so that gokrazy retries a second later.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nftgate/nftgate/image/network"
	"github.com/vishvananda/netlink"
)

func main() {
	configPath := flag.String("config", "/etc/nftgate/network.json", "network configuration (JSON)")
	linkTimeout := flag.Duration("link_timeout", 60*time.Second, "how long to wait for a configured interface to appear")
	flag.Parse()

	c, err := network.Load(*configPath)
	if err != nil {
		log.Fatal(err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *linkTimeout)
	defer cancel()
	if err := c.Apply(ctx, h, "/proc/sys"); err != nil {
		log.Fatal(err)
	}
	for _, s := range c.EffectiveSysctls() {
		log.Printf("sysctl %s=%s", s.Name, s.Value)
	}
	for _, ifc := range c.Interfaces {
		vlan := ""
		if ifc.VLAN != nil {
			vlan = fmt.Sprintf(" vlan=%d on %s", ifc.VLAN.ID, ifc.VLAN.Link)
		}
		log.Printf("interface %s:%s dhcp=%v addresses=%v routes=%v", ifc.Name, vlan, ifc.DHCP, ifc.Addresses, ifc.Routes)
	}
	// 125 tells gokrazy's supervisor not to restart this program.
	os.Exit(125)
}
