package gateways

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is the [gateways] section of nftgate's configuration: this
// gateway's name, where the channel listens, the other gateways of the set
// and the shared key. A zero value of a field means its default (see
// WithDefaults); Validate names the field and value it refuses.
type Config struct {
	// Name is this gateway's name in the set (required): a DNS label,
	// the same on every peer's list.
	Name string `toml:"name" json:"name"`
	// Listen is the TCP address the channel listens on, "host:port"
	// (host empty: every address, so one listener serves several links).
	// Default ":7480".
	Listen string `toml:"listen" json:"listen"`
	// KeyFile holds the key shared by every gateway of the set (required):
	// at least 32 bytes, white space around it ignored.
	KeyFile string `toml:"key_file" json:"key_file"`
	// HeartbeatInterval is how often a heartbeat goes to each peer on
	// each link. Default 100ms, from 10ms to 10s.
	HeartbeatInterval time.Duration `toml:"heartbeat_interval" json:"heartbeat_interval"`
	// DeadAfter is how many heartbeat intervals without a word from a
	// peer (on any link) make it dead. Default 3, from 2 to 100.
	DeadAfter int `toml:"dead_after" json:"dead_after"`
	// StartupWait is how long a starting gateway waits for its peers
	// before it takes addresses nobody else holds. Default 1s, at most 1m.
	StartupWait time.Duration `toml:"startup_wait" json:"startup_wait"`
	// Mode is how the floating addresses are shared out: ModeActiveBackup
	// (the default) or ModeActiveActive.
	Mode string `toml:"mode" json:"mode"`
	// ReadyTimeout bounds how long a gateway that is not ready
	// (Options.Ready not closed) stays out of the candidates while a ready
	// peer is alive; Options.ReadyHold can extend it while the flow state
	// still arrives, up to ReadyHoldMax times. Default 30s, from 1s to 10m.
	ReadyTimeout time.Duration `toml:"ready_timeout" json:"ready_timeout"`
	// Peers are the other gateways of the set.
	Peers []PeerConfig `toml:"peers" json:"peers"`

	// StateSync replicates the conntrack entries of the flows each
	// gateway translates to the others (package statesync), so that
	// connections survive a gateway. Default true; it needs a kernel with
	// conntrack events and marks.
	StateSync *bool `toml:"state_sync" json:"state_sync"`
	// SyncQueue bounds the updates waiting per peer (distinct flows); an
	// overflow drops them and resyncs the peer. Default 65536.
	SyncQueue int `toml:"sync_queue" json:"sync_queue"`
	// SyncBatchInterval and SyncBatchBytes: a batch of updates goes to a
	// peer when its oldest waited this long or this many bytes are ready.
	// Defaults 10ms and 65536.
	SyncBatchInterval time.Duration `toml:"sync_batch_interval" json:"sync_batch_interval"`
	SyncBatchBytes    int           `toml:"sync_batch_bytes" json:"sync_batch_bytes"`
	// SyncRefreshInterval is how often the entries whose replicas would
	// expire (UDP, short TCP states) are read again; one pass in 12 reads
	// the whole table. Default 5s.
	SyncRefreshInterval time.Duration `toml:"sync_refresh_interval" json:"sync_refresh_interval"`
	// MidstreamTCP is what becomes of a TCP packet to a masqueraded
	// Service connection that has no conntrack entry here and is not a
	// SYN: a connection another gateway opened, moved here by the router.
	// MidstreamWait (the default with state sync) drops it, so that the
	// client retransmits and meets the entry the state sync brings;
	// MidstreamPickup (the default and only value without state sync) has
	// conntrack pick it up and masquerade it afresh, to an address the
	// endpoint does not know, which resets it.
	MidstreamTCP string `toml:"midstream_tcp" json:"midstream_tcp"`
	// MidstreamTCPWait bounds, with MidstreamWait, how long one
	// connection's packets are dropped: the first after is picked up, as
	// with MidstreamPickup, so that a connection whose replica never comes
	// (its gateway failed within the sync's lag) carries on where the
	// address and port it was masqueraded to are this gateway's too, or is
	// reset at once, rather than hanging until its client gives up. Default
	// twice SyncRefreshInterval (a replica whose events were lost is sent
	// by the origin's next refresh), from 1s to 10m.
	MidstreamTCPWait time.Duration `toml:"midstream_tcp_wait" json:"midstream_tcp_wait"`
	// MidstreamTCPWaitPeerDead bounds the wait instead of MidstreamTCPWait
	// while a peer of the set is dead (told dead after it was heard
	// alive): the connections that wait then are mostly the dead peer's
	// that it opened within the sync's lag, whose replicas never come, and
	// the longer wait (for a live peer's replica whose events were lost,
	// until its next refresh) only holds them up. Default
	// max(500ms, 4 × SyncBatchInterval), at most MidstreamTCPWait; from
	// max(100ms, 2 × SyncBatchInterval), which a live peer's replica in
	// flight takes, to MidstreamTCPWait (that value: no shorter wait).
	MidstreamTCPWaitPeerDead time.Duration `toml:"midstream_tcp_wait_peer_dead" json:"midstream_tcp_wait_peer_dead"`
	// ConntrackEvents is which connections conntrack reports events of:
	// EventsServices only those nftgate translates to a Service, the ones
	// the sync replicates, sparing the kernel the events of every routed
	// connection, which the sync would drop; EventsLean those too, but of
	// a masqueraded TCP connection only the five a replica needs (its
	// start, the endpoint's answer, the handshake's end, the first FIN or
	// RST, its end; it needs the kernel's ct labels); EventsAuto (the
	// default with state sync) EventsLean where the kernel has ct labels
	// and the release keeps conntrack's TIME_WAIT short, EventsServices
	// elsewhere, chosen at start; EventsAll (the default and only value
	// without state sync) every connection's, for other listeners on the
	// gateway (conntrack -E, ulogd).
	ConntrackEvents string `toml:"conntrack_events" json:"conntrack_events"`
	// TrackInterfaces are the network interfaces whose link this gateway
	// needs to carry what it holds: while one is not operationally up
	// (carrier lost, set down, gone) the gateway is faulty (Set.SetFault)
	// and hands what a fit peer can hold over to it. nil: the
	// configuration's reader fills in the [l2] interfaces; empty: none.
	TrackInterfaces []string `toml:"track_interfaces" json:"track_interfaces"`
	// TrackUpAfter is how long every tracked interface must have been up
	// before a faulty gateway counts as fit again, so that a flapping
	// link does not move the addresses at every flap. Default 2s, from 0s
	// to 10m.
	TrackUpAfter *time.Duration `toml:"track_up_after" json:"track_up_after"`
	// Homes are, in active-active mode, the masquerade addresses of each
	// gateway of the set (this one's included), by name: each is held by
	// its own gateway while it is alive and ready. The configuration's
	// reader parses them (masquerade_addresses, and each peer's).
	Homes map[string][]netip.Addr `toml:"-" json:"-"`
}

// Modes.
const (
	// ModeActiveBackup: one gateway, the active, holds every floating
	// address (over L2 and BGP alike); the active is the first in name
	// order among the live gateways that serve the address.
	ModeActiveBackup = "active-backup"
	// ModeActiveActive: each floating address has its own owner
	// (rendezvous hash), a gateway's masquerade addresses are held by it
	// while it lives, and the Service addresses go over BGP from every
	// gateway (ECMP).
	ModeActiveActive = "active-active"
)

// What becomes of a TCP packet picked up in mid-stream (Config.MidstreamTCP).
const (
	MidstreamWait   = "wait"
	MidstreamPickup = "pickup"
)

// Which connections conntrack reports events of (Config.ConntrackEvents).
const (
	EventsAuto     = "auto"
	EventsLean     = "lean"
	EventsServices = "services"
	EventsAll      = "all"
)

// PeerConfig is one other gateway.
type PeerConfig struct {
	Name string `toml:"name" json:"name"`
	// Addresses are where its channel listens, "host:port", one per link
	// (the channel runs over each of them; the peer is alive while any of
	// them carries its heartbeats).
	Addresses []string `toml:"addresses" json:"addresses"`
	// MasqueradeAddresses are its masquerade addresses (active-active
	// mode): held by it while it lives, taken over by a survivor when it
	// dies. Addresses or CIDRs, as masquerade_addresses.
	MasqueradeAddresses []string `toml:"masquerade_addresses" json:"masquerade_addresses,omitempty"`
}

// Key is the configuration section this Config is read from.
const Key = "gateways"

// Defaults.
const (
	DefaultListen            = ":7480"
	DefaultHeartbeatInterval = 100 * time.Millisecond
	DefaultDeadAfter         = 3
	DefaultStartupWait       = time.Second
	DefaultReadyTimeout      = 30 * time.Second
	// MinKeyLen is the shortest shared key accepted.
	MinKeyLen                  = 32
	DefaultSyncQueue           = 65536
	DefaultSyncBatchInterval   = 10 * time.Millisecond
	DefaultSyncBatchBytes      = 64 << 10
	DefaultSyncRefreshInterval = 5 * time.Second
	DefaultTrackUpAfter        = 2 * time.Second
	// DefaultMidstreamTCPWaitPeerDead is MidstreamTCPWaitPeerDead's
	// default with a SyncBatchInterval of at most a quarter of it.
	DefaultMidstreamTCPWaitPeerDead = 500 * time.Millisecond
	// maxPeers bounds the set (every pair holds a connection per link).
	maxPeers = 32
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.StartupWait == 0 {
		c.StartupWait = DefaultStartupWait
	}
	if c.StateSync == nil {
		on := true
		c.StateSync = &on
	}
	c.SyncQueue = cmp.Or(c.SyncQueue, DefaultSyncQueue)
	c.SyncBatchInterval = cmp.Or(c.SyncBatchInterval, DefaultSyncBatchInterval)
	c.SyncBatchBytes = cmp.Or(c.SyncBatchBytes, DefaultSyncBatchBytes)
	c.SyncRefreshInterval = cmp.Or(c.SyncRefreshInterval, DefaultSyncRefreshInterval)
	if c.Mode == "" {
		c.Mode = ModeActiveBackup
	}
	if c.MidstreamTCP == "" {
		c.MidstreamTCP = MidstreamPickup
		if *c.StateSync {
			c.MidstreamTCP = MidstreamWait
		}
	}
	if c.MidstreamTCP == MidstreamWait && c.MidstreamTCPWait == 0 {
		c.MidstreamTCPWait = 2 * c.SyncRefreshInterval
	}
	if c.MidstreamTCP == MidstreamWait && c.MidstreamTCPWaitPeerDead == 0 {
		c.MidstreamTCPWaitPeerDead = min(c.MidstreamTCPWait, max(DefaultMidstreamTCPWaitPeerDead, 4*c.SyncBatchInterval))
	}
	if c.ConntrackEvents == "" {
		c.ConntrackEvents = EventsAll
		if *c.StateSync {
			c.ConntrackEvents = EventsAuto
		}
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.TrackUpAfter == nil {
		d := DefaultTrackUpAfter
		c.TrackUpAfter = &d
	} else {
		d := *c.TrackUpAfter
		c.TrackUpAfter = &d
	}
	c.TrackInterfaces = slices.Clone(c.TrackInterfaces)
	peers := make([]PeerConfig, len(c.Peers))
	for i, p := range c.Peers {
		peers[i] = PeerConfig{Name: p.Name, Addresses: slices.Clone(p.Addresses), MasqueradeAddresses: slices.Clone(p.MasqueradeAddresses)}
	}
	c.Peers = peers
	if c.Homes != nil {
		homes := make(map[string][]netip.Addr, len(c.Homes))
		for n, as := range c.Homes {
			homes[n] = slices.Clone(as)
		}
		c.Homes = homes
	}
	return c
}

var namePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Validate checks a Config after WithDefaults and returns an error naming
// the first field and value it refuses. It does not read the key file
// (ReadKey does).
func (c Config) Validate() error {
	if !namePattern.MatchString(c.Name) {
		return fmt.Errorf("%s.name = %q: want a DNS label (lower-case letters, digits, '-', at most 63)", Key, c.Name)
	}
	if err := checkHostPort(c.Listen, true); err != nil {
		return fmt.Errorf("%s.listen = %q: %v", Key, c.Listen, err)
	}
	if c.KeyFile == "" {
		return fmt.Errorf("%s.key_file = \"\": want the file holding the set's shared key", Key)
	}
	if c.HeartbeatInterval < 10*time.Millisecond || c.HeartbeatInterval > 10*time.Second {
		return fmt.Errorf("%s.heartbeat_interval = %q: want 10ms to 10s", Key, c.HeartbeatInterval.String())
	}
	if c.DeadAfter < 2 || c.DeadAfter > 100 {
		return fmt.Errorf("%s.dead_after = %d: want 2 to 100", Key, c.DeadAfter)
	}
	if c.StartupWait < 0 || c.StartupWait > time.Minute {
		return fmt.Errorf("%s.startup_wait = %q: want 0 to 1m", Key, c.StartupWait.String())
	}
	if c.SyncQueue < 1024 || c.SyncQueue > 1<<22 {
		return fmt.Errorf("%s.sync_queue = %d: want 1024 to %d", Key, c.SyncQueue, 1<<22)
	}
	if c.SyncBatchInterval < time.Millisecond || c.SyncBatchInterval > time.Second {
		return fmt.Errorf("%s.sync_batch_interval = %q: want 1ms to 1s", Key, c.SyncBatchInterval.String())
	}
	if c.SyncBatchBytes < 4<<10 || c.SyncBatchBytes > 1<<20 {
		return fmt.Errorf("%s.sync_batch_bytes = %d: want 4096 to 1048576", Key, c.SyncBatchBytes)
	}
	if c.SyncRefreshInterval < time.Second || c.SyncRefreshInterval > time.Minute {
		return fmt.Errorf("%s.sync_refresh_interval = %q: want 1s to 1m", Key, c.SyncRefreshInterval.String())
	}
	if c.Mode != ModeActiveBackup && c.Mode != ModeActiveActive {
		return fmt.Errorf("%s.mode = %q: want %q or %q", Key, c.Mode, ModeActiveBackup, ModeActiveActive)
	}
	switch {
	case c.MidstreamTCP != MidstreamWait && c.MidstreamTCP != MidstreamPickup:
		return fmt.Errorf("%s.midstream_tcp = %q: want %q or %q", Key, c.MidstreamTCP, MidstreamWait, MidstreamPickup)
	case c.MidstreamTCP == MidstreamWait && !*c.StateSync:
		return fmt.Errorf("%s.midstream_tcp = %q: needs state_sync = true (without it no entry ever comes, and a connection would hang rather than be reset)", Key, c.MidstreamTCP)
	case c.MidstreamTCP != MidstreamWait && c.MidstreamTCPWait != 0:
		return fmt.Errorf("%s.midstream_tcp_wait = %q: needs midstream_tcp = %q (%q waits for nothing)", Key, c.MidstreamTCPWait.String(), MidstreamWait, c.MidstreamTCP)
	case c.MidstreamTCP == MidstreamWait && (c.MidstreamTCPWait < time.Second || c.MidstreamTCPWait > 10*time.Minute):
		return fmt.Errorf("%s.midstream_tcp_wait = %q: want 1s to 10m", Key, c.MidstreamTCPWait.String())
	case c.MidstreamTCP != MidstreamWait && c.MidstreamTCPWaitPeerDead != 0:
		return fmt.Errorf("%s.midstream_tcp_wait_peer_dead = %q: needs midstream_tcp = %q (%q waits for nothing)", Key, c.MidstreamTCPWaitPeerDead.String(), MidstreamWait, c.MidstreamTCP)
	case c.MidstreamTCP == MidstreamWait && c.MidstreamTCPWaitPeerDead != c.MidstreamTCPWait && // that value: no shorter wait
		(c.MidstreamTCPWaitPeerDead < max(100*time.Millisecond, 2*c.SyncBatchInterval) || c.MidstreamTCPWaitPeerDead > c.MidstreamTCPWait):
		return fmt.Errorf("%s.midstream_tcp_wait_peer_dead = %q: want %s (100ms, and twice sync_batch_interval, which a live peer's replica in flight may take) to midstream_tcp_wait (%s; that value: no shorter wait)",
			Key, c.MidstreamTCPWaitPeerDead.String(), max(100*time.Millisecond, 2*c.SyncBatchInterval), c.MidstreamTCPWait)
	}
	switch {
	case !slices.Contains([]string{EventsAuto, EventsLean, EventsServices, EventsAll}, c.ConntrackEvents):
		return fmt.Errorf("%s.conntrack_events = %q: want %q, %q, %q or %q", Key, c.ConntrackEvents, EventsAuto, EventsLean, EventsServices, EventsAll)
	case c.ConntrackEvents != EventsAll && !*c.StateSync:
		return fmt.Errorf("%s.conntrack_events = %q: needs state_sync = true (only the state sync wants the Services' events alone)", Key, c.ConntrackEvents)
	}
	if c.ReadyTimeout < time.Second || c.ReadyTimeout > 10*time.Minute {
		return fmt.Errorf("%s.ready_timeout = %q: want 1s to 10m", Key, c.ReadyTimeout.String())
	}
	for i, n := range c.TrackInterfaces {
		if n == "" || len(n) >= 16 || n == "." || n == ".." || strings.ContainsAny(n, "/: \t\n") {
			return fmt.Errorf("%s.track_interfaces[%d] = %q: want a network interface name (1 to 15 bytes, no '/', ':' or white space)", Key, i, n)
		}
		if j := slices.Index(c.TrackInterfaces[:i], n); j >= 0 {
			return fmt.Errorf("%s.track_interfaces[%d] = %q: listed twice (also track_interfaces[%d])", Key, i, n, j)
		}
	}
	if d := *c.TrackUpAfter; d < 0 || d > 10*time.Minute {
		return fmt.Errorf("%s.track_up_after = %q: want 0s to 10m", Key, d.String())
	}
	if len(c.Peers) == 0 {
		return fmt.Errorf("%s.peers = []: want at least one other gateway", Key)
	}
	if len(c.Peers) > maxPeers {
		return fmt.Errorf("%s.peers: %d gateways, at most %d", Key, len(c.Peers), maxPeers)
	}
	seen := map[string]string{c.Name: Key + ".name"}
	for i, p := range c.Peers {
		field := fmt.Sprintf("%s.peers[%d]", Key, i)
		if !namePattern.MatchString(p.Name) {
			return fmt.Errorf("%s.name = %q: want a DNS label (lower-case letters, digits, '-', at most 63)", field, p.Name)
		}
		if other, ok := seen[p.Name]; ok {
			return fmt.Errorf("%s.name = %q: also %s", field, p.Name, other)
		}
		seen[p.Name] = field + ".name"
		if len(p.Addresses) == 0 {
			return fmt.Errorf("%s.addresses = []: want the peer's channel address, \"host:port\"", field)
		}
		for j, a := range p.Addresses {
			if err := checkHostPort(a, false); err != nil {
				return fmt.Errorf("%s.addresses[%d] = %q: %v", field, j, a, err)
			}
			if k := slices.Index(p.Addresses[:j], a); k >= 0 {
				return fmt.Errorf("%s.addresses[%d] = %q: listed twice (also addresses[%d])", field, j, a, k)
			}
		}
		if len(p.MasqueradeAddresses) > 0 && c.Mode != ModeActiveActive {
			return fmt.Errorf("%s.masquerade_addresses = %q: only in mode %q (in %q every gateway lists the one floating address in its own masquerade_addresses)",
				field, p.MasqueradeAddresses, ModeActiveActive, c.Mode)
		}
	}
	return nil
}

func checkHostPort(s string, hostMayBeEmpty bool) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want \"host:port\"")
	}
	if host == "" && !hostMayBeEmpty {
		return fmt.Errorf("want a host before the port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// ReadKey reads the shared key from c.KeyFile; the error names the key and
// the file.
func (c Config) ReadKey() ([]byte, error) {
	b, err := os.ReadFile(c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s.key_file = %q: %w", Key, c.KeyFile, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinKeyLen {
		return nil, fmt.Errorf("%s.key_file = %q: the key has %d bytes, want at least %d (e.g. head -c 32 /dev/urandom | base64 > %s)",
			Key, c.KeyFile, len(b), MinKeyLen, c.KeyFile)
	}
	return b, nil
}

// Names are the gateways of the set, this one included, sorted.
func (c Config) Names() []string {
	names := []string{c.Name}
	for _, p := range c.Peers {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// SetHash identifies the configured set as every gateway must see it:
// what ownership is a function of (the names, the mode, each gateway's
// masquerade addresses in active-active mode) and the heartbeat timing
// (liveness must mean the same on both ends). The channel addresses are
// not part of it: they are per link and one gateway's listen address may
// be another's peer address behind a NAT or a wildcard.
func (c Config) SetHash() [32]byte {
	h := sha256.New()
	h.Write([]byte("nftgate gateway set v2\x00"))
	h.Write([]byte(c.Mode))
	h.Write([]byte{0})
	for _, n := range c.Names() {
		h.Write([]byte(n))
		h.Write([]byte{0})
		if c.Mode == ModeActiveActive {
			for _, a := range slices.SortedFunc(slices.Values(c.Homes[n]), netip.Addr.Compare) {
				b, _ := a.Unmap().MarshalBinary()
				h.Write(b)
			}
			h.Write([]byte{0})
		}
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(c.HeartbeatInterval))
	binary.BigEndian.PutUint64(b[8:], uint64(c.DeadAfter))
	h.Write(b[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// home maps each gateway's masquerade address to its name (active-active
// mode; nil otherwise).
func (c Config) home() map[netip.Addr]string {
	if c.Mode != ModeActiveActive {
		return nil
	}
	out := map[netip.Addr]string{}
	for n, as := range c.Homes {
		for _, a := range as {
			out[a.Unmap()] = n
		}
	}
	return out
}
