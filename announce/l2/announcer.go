package l2

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus"
)

// Announcer answers ARP and neighbour solicitations for a set of addresses
// on the configured interfaces. Its methods are safe for concurrent use.
type Announcer struct {
	cfg    Config
	log    *slog.Logger
	ifaces []*iface

	mu     sync.RWMutex // guards addrs, iface.groups and closed
	addrs  map[netip.Addr]*entry
	closed bool

	stop chan struct{}
	wg   sync.WaitGroup

	answered   *prometheus.CounterVec // interface, family
	gratuitous *prometheus.CounterVec // interface, family
}

// entry is one announced address.
type entry struct {
	since          time.Time
	lastGratuitous time.Time
	pending        int // gratuitous messages still to send
}

// iface is one configured interface and its sockets.
type iface struct {
	ifi *net.Interface
	arp *packet.Conn // ARP frames in and out
	// IPv6: neighbour solicitations in through a packet socket (so that
	// unicast solicitations for an address the kernel would not deliver
	// locally are seen too), advertisements out through an ICMPv6 socket
	// that also holds the solicited-node group memberships. Both nil when
	// the interface has no IPv6 link-local address.
	ns     *packet.Conn
	ndp    *ndp.Conn
	groups map[netip.Addr]int // solicited-node group → announced addresses in it
}

// New opens the sockets on every interface of cfg (after WithDefaults) in
// the calling thread's network namespace and starts answering; it
// announces nothing until Set. It returns an error naming the interface
// when one is missing or its sockets cannot be opened (and then holds
// nothing open).
func New(cfg Config, log *slog.Logger) (*Announcer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Announcer{
		cfg:   cfg,
		log:   log,
		addrs: map[netip.Addr]*entry{},
		stop:  make(chan struct{}),
		answered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftgate_l2_requests_answered_total",
			Help: "ARP requests (ipv4) and neighbour solicitations (ipv6) answered for announced addresses.",
		}, []string{"interface", "family"}),
		gratuitous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftgate_l2_gratuitous_sent_total",
			Help: "Gratuitous ARP (ipv4) and unsolicited neighbour advertisements (ipv6) sent.",
		}, []string{"interface", "family"}),
	}
	for i, name := range cfg.Interfaces {
		ifc, err := openIface(name)
		if err != nil {
			a.closeSockets()
			return nil, fmt.Errorf("%s.interfaces[%d] = %q: %w", Key, i, name, err)
		}
		if ifc.ndp == nil {
			log.Warn("l2: no IPv6 link-local address: IPv6 addresses are not announced here", "interface", name)
		}
		a.ifaces = append(a.ifaces, ifc)
	}
	for _, ifc := range a.ifaces {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.serveARP(ifc) }()
		if ifc.ns != nil {
			a.wg.Add(1)
			go func() { defer a.wg.Done(); a.serveNDP(ifc) }()
		}
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.repeatGratuitous() }()
	return a, nil
}

func openIface(name string) (*iface, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("not an Ethernet interface (hardware address %q)", ifi.HardwareAddr)
	}
	ifc := &iface{ifi: ifi, groups: map[netip.Addr]int{}}
	if ifc.arp, err = listenARP(ifi); err != nil {
		return nil, fmt.Errorf("ARP socket: %w", err)
	}
	if !hasLinkLocal6(ifi) {
		return ifc, nil
	}
	if ifc.ndp, ifc.ns, err = listenNDP(ifi); err != nil {
		ifc.arp.Close()
		return nil, fmt.Errorf("NDP sockets: %w", err)
	}
	return ifc, nil
}

func hasLinkLocal6(ifi *net.Interface) bool {
	addrs, err := ifi.Addrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			return true
		}
	}
	return false
}

// Set makes the announced addresses equal to addrs: an address new to the
// set is answered for from now on and gratuitous messages go out for it
// (GratuitousCount of them); an address no longer in the set is no longer
// answered for. IPv4-mapped IPv6 addresses count as IPv4; invalid,
// unspecified, multicast and link-local addresses are ignored. Set is
// idempotent and costs one map comparison when nothing changed.
func (a *Announcer) Set(addrs []netip.Addr) {
	want := make(map[netip.Addr]bool, len(addrs))
	for _, ad := range addrs {
		ad = ad.Unmap().WithZone("")
		if !ad.IsValid() || ad.IsUnspecified() || ad.IsMulticast() || ad.IsLinkLocalUnicast() || ad.IsLoopback() {
			continue
		}
		want[ad] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	for ad := range a.addrs {
		if !want[ad] {
			delete(a.addrs, ad)
			a.leaveGroups(ad)
			a.log.Info("l2: no longer announced", "address", ad)
		}
	}
	now := time.Now()
	for ad := range want {
		if _, ok := a.addrs[ad]; ok {
			continue
		}
		e := &entry{since: now, pending: a.cfg.GratuitousCount}
		a.addrs[ad] = e
		a.joinGroups(ad)
		a.sendGratuitous(ad, e)
		a.log.Info("l2: announced", "address", ad)
	}
}

// joinGroups joins ad's solicited-node multicast group on every interface
// (IPv6 only), so that the interface accepts the solicitations for it.
// Called with a.mu held.
func (a *Announcer) joinGroups(ad netip.Addr) {
	if !ad.Is6() {
		return
	}
	g, _ := ndp.SolicitedNodeMulticast(ad)
	for _, ifc := range a.ifaces {
		if ifc.ndp == nil {
			continue
		}
		if ifc.groups[g] == 0 {
			if err := ifc.ndp.JoinGroup(g); err != nil {
				a.log.Warn("l2: join solicited-node group", "interface", ifc.ifi.Name, "group", g, "error", err)
			}
		}
		ifc.groups[g]++
	}
}

// leaveGroups undoes joinGroups. Called with a.mu held.
func (a *Announcer) leaveGroups(ad netip.Addr) {
	if !ad.Is6() {
		return
	}
	g, _ := ndp.SolicitedNodeMulticast(ad)
	for _, ifc := range a.ifaces {
		if ifc.ndp == nil || ifc.groups[g] == 0 {
			continue
		}
		ifc.groups[g]--
		if ifc.groups[g] == 0 {
			delete(ifc.groups, g)
			if err := ifc.ndp.LeaveGroup(g); err != nil {
				a.log.Warn("l2: leave solicited-node group", "interface", ifc.ifi.Name, "group", g, "error", err)
			}
		}
	}
}

// sendGratuitous sends one gratuitous ARP or unsolicited neighbour
// advertisement for ad on every interface. Called with a.mu held.
func (a *Announcer) sendGratuitous(ad netip.Addr, e *entry) {
	for _, ifc := range a.ifaces {
		var err error
		switch {
		case ad.Is4():
			err = ifc.gratuitousARP(ad)
		case ifc.ndp != nil:
			err = ifc.unsolicitedNA(ad)
		default:
			continue
		}
		if err != nil {
			a.log.Warn("l2: gratuitous message", "interface", ifc.ifi.Name, "address", ad, "error", err)
			continue
		}
		a.gratuitous.WithLabelValues(ifc.ifi.Name, family(ad)).Inc()
	}
	e.lastGratuitous = time.Now()
	e.pending--
}

// repeatGratuitous sends the remaining gratuitous messages of new
// addresses, one round per GratuitousInterval.
func (a *Announcer) repeatGratuitous() {
	t := time.NewTicker(a.cfg.GratuitousInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		a.mu.Lock()
		for ad, e := range a.addrs {
			if e.pending > 0 {
				a.sendGratuitous(ad, e)
			}
		}
		a.mu.Unlock()
	}
}

// announced tells whether ad is in the set.
func (a *Announcer) announced(ad netip.Addr) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	_, ok := a.addrs[ad]
	return ok
}

// Close stops answering and closes every socket. It sends nothing: a
// restarted process announces its addresses again from its first Set.
func (a *Announcer) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	close(a.stop)
	err := a.closeSockets()
	a.wg.Wait()
	return err
}

func (a *Announcer) closeSockets() error {
	var errs []error
	for _, ifc := range a.ifaces {
		errs = append(errs, ifc.arp.Close())
		if ifc.ns != nil {
			errs = append(errs, ifc.ns.Close(), ifc.ndp.Close())
		}
	}
	return errors.Join(errs...)
}

// AddressStatus is one announced address, for the status page and the API.
type AddressStatus struct {
	Address netip.Addr `json:"address"`
	// Interfaces it is answered on.
	Interfaces []string `json:"interfaces"`
	// Since is when it started being announced by this process.
	Since time.Time `json:"since"`
	// LastGratuitous is when the last gratuitous ARP or unsolicited
	// neighbour advertisement for it was sent.
	LastGratuitous time.Time `json:"lastGratuitous,omitzero"`
}

// Status returns the announced addresses, sorted.
func (a *Announcer) Status() []AddressStatus {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]AddressStatus, 0, len(a.addrs))
	for ad, e := range a.addrs {
		st := AddressStatus{Address: ad, Since: e.since, LastGratuitous: e.lastGratuitous, Interfaces: []string{}}
		for _, ifc := range a.ifaces {
			if ad.Is4() || ifc.ndp != nil {
				st.Interfaces = append(st.Interfaces, ifc.ifi.Name)
			}
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(x, y AddressStatus) int { return x.Address.Compare(y.Address) })
	return out
}

// Register adds the announcer's metrics to reg:
// nftgate_l2_announced_addresses{family},
// nftgate_l2_requests_answered_total{interface,family} and
// nftgate_l2_gratuitous_sent_total{interface,family}.
func (a *Announcer) Register(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{a.answered, a.gratuitous}
	for _, fam := range []string{"ipv4", "ipv6"} {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "nftgate_l2_announced_addresses",
			Help:        "Addresses this gateway answers ARP or neighbour solicitations for.",
			ConstLabels: prometheus.Labels{"family": fam},
		}, func() float64 {
			a.mu.RLock()
			defer a.mu.RUnlock()
			n := 0
			for ad := range a.addrs {
				if family(ad) == fam {
					n++
				}
			}
			return float64(n)
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func family(ad netip.Addr) string {
	if ad.Is4() {
		return "ipv4"
	}
	return "ipv6"
}

// readBackoff is the pause after a failed read before the next, so that a
// persistent socket error does not spin.
const readBackoff = 100 * time.Millisecond

// readFailed logs err and tells whether the read loop should end (the
// socket was closed).
func (a *Announcer) readFailed(ifc *iface, what string, err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	a.log.Warn("l2: read", "interface", ifc.ifi.Name, "socket", what, "error", err)
	t := time.NewTimer(readBackoff)
	defer t.Stop()
	select {
	case <-a.stop:
		return true
	case <-t.C:
		return false
	}
}
