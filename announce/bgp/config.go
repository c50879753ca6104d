package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is the [bgp] section of nftgate's configuration. Durations are
// written as "90s", "300ms" (BurntSushi/toml decodes them into
// time.Duration). A zero value of a field means its default (see
// WithDefaults); Validate names the field and value it refuses.
type Config struct {
	// ASN is this gateway's autonomous system number (required).
	ASN uint32 `toml:"asn" json:"asn"`
	// RouterID is the BGP identifier, an IPv4 address (required, also on
	// IPv6-only gateways).
	RouterID string `toml:"router_id" json:"router_id"`
	// ListenPort is where peers may connect: 179 by default, -1 for none
	// (every peer is dialled).
	ListenPort int `toml:"listen_port" json:"listen_port"`
	// NextHopIPv4 and NextHopIPv6 are the next hop announced with every
	// prefix of the family. Empty: the address of the session's local end
	// (next hop self).
	NextHopIPv4 string `toml:"next_hop_ipv4" json:"next_hop_ipv4"`
	NextHopIPv6 string `toml:"next_hop_ipv6" json:"next_hop_ipv6"`
	// MED is the multi-exit discriminator (RFC 4271) sent with every
	// route: of several gateways announcing the same address to a router,
	// the one with the lowest MED is preferred (the others are its
	// backups). Absent: none (a router takes that as 0, or as the worst
	// with "med missing as worst").
	MED *uint32 `toml:"med" json:"med,omitempty"`
	// ASPathPrepend is how many extra times the gateway's asn is put
	// before the AS path of every route, 0 to 10: a longer path makes
	// this gateway the less preferred one, also to routers beyond the
	// peer. eBGP peers only (an iBGP peer would see its own AS and drop
	// the route).
	ASPathPrepend int `toml:"as_path_prepend" json:"as_path_prepend,omitempty"`
	// RestartTime is the graceful restart time (RFC 4724) advertised to
	// every peer: how long a peer keeps this gateway's routes after the
	// session drops without a withdrawal. "0s": the default, 120s;
	// "-1s": no graceful restart. At most 4095s.
	RestartTime time.Duration `toml:"restart_time" json:"restart_time"`
	// SelectionDeferral bounds how long a restarted speaker waits for its
	// peers' End-of-RIB before it announces (RFC 4724's selection deferral
	// timer). Default 5s.
	SelectionDeferral time.Duration `toml:"restart_deferral" json:"restart_deferral"`
	// Peers are the routers this gateway announces to.
	Peers []PeerConfig `toml:"peer" json:"peer"`
	// Pools are the path attributes announced with the addresses of each
	// address pool, by pool name. A pool not listed gets none.
	Pools map[string]PoolConfig `toml:"pool" json:"pool"`
}

// PeerConfig is one [[bgp.peer]].
type PeerConfig struct {
	// Address of the peer (required). The peer receives the prefixes of
	// its address family.
	Address string `toml:"address" json:"address"`
	// ASN of the peer (required); equal to the local ASN for iBGP.
	ASN uint32 `toml:"asn" json:"asn"`
	// LocalASN overrides Config.ASN for this session.
	LocalASN uint32 `toml:"local_asn" json:"local_asn"`
	// Port is the peer's BGP port, 179 by default.
	Port int `toml:"port" json:"port"`
	// PasswordFile holds the TCP-MD5 (RFC 2385) password of the session,
	// trailing newline removed. Empty: no TCP-MD5.
	PasswordFile string `toml:"password_file" json:"password_file"`
	// HoldTime proposed for the session, default 90s, between 3s and
	// 65535s, whole seconds; keepalives are sent every third of it.
	HoldTime time.Duration `toml:"hold_time" json:"hold_time"`
	// ConnectRetry is the wait between two attempts to connect, default
	// 5s.
	ConnectRetry time.Duration `toml:"connect_retry" json:"connect_retry"`
	// IdleHoldAfterReset is how long the session stays idle after this
	// speaker reset it (BFD down) before it connects again, default 3s
	// (GoBGP's own default, 30s, made one BFD blip a 30 s outage). A
	// session that goes down again before it has stayed up for
	// IdleHoldAfterResetMax waits twice as long as the time before, up to
	// IdleHoldAfterResetMax (default 60s): a flapping session is dampened,
	// not re-established in a tight loop. Equal values: no dampening.
	IdleHoldAfterReset    time.Duration `toml:"idle_hold_after_reset" json:"idle_hold_after_reset"`
	IdleHoldAfterResetMax time.Duration `toml:"idle_hold_after_reset_max" json:"idle_hold_after_reset_max"`
	// Multihop is the TTL of an eBGP session to a peer not on a connected
	// network, 2 to 255. 0: directly connected (TTL 1 for eBGP).
	Multihop int `toml:"multihop" json:"multihop"`
	// Passive: wait for the peer to connect, never dial it.
	Passive bool `toml:"passive" json:"passive"`
	// BFD turns on single-hop BFD (RFC 5880/5881) for the session: a
	// failure detected by BFD takes the session down at once.
	BFD bool `toml:"bfd" json:"bfd"`
	// BFDInterval is the BFD transmit and receive interval, default 300ms.
	BFDInterval time.Duration `toml:"bfd_interval" json:"bfd_interval"`
	// BFDMultiplier is the number of missed BFD packets that declare the
	// peer down, default 3.
	BFDMultiplier int `toml:"bfd_multiplier" json:"bfd_multiplier"`
}

// PoolConfig is one [bgp.pool.NAME]: the attributes announced with every
// address of the pool.
type PoolConfig struct {
	// Communities (RFC 1997): "ASN:value", or one of "no-export",
	// "no-advertise", "no-export-subconfed", "blackhole".
	Communities []string `toml:"communities" json:"communities"`
	// LocalPreference sent to iBGP peers (eBGP peers never receive one).
	// 0: none.
	LocalPreference uint32 `toml:"local_preference" json:"local_preference"`
	// MED and ASPathPrepend replace the gateway's (Config.MED,
	// Config.ASPathPrepend) for the addresses of the pool; absent: the
	// gateway's.
	MED           *uint32 `toml:"med" json:"med,omitempty"`
	ASPathPrepend *int    `toml:"as_path_prepend" json:"as_path_prepend,omitempty"`
}

// MaxASPathPrepend bounds as_path_prepend: a few prepends already lose
// every comparison; more only lengthen every router's tables.
const MaxASPathPrepend = 10

// Defaults of the fields a zero value leaves to the speaker.
const (
	DefaultListenPort            = 179
	DefaultRestartTime           = 120 * time.Second
	DefaultSelectionDeferral     = 5 * time.Second
	DefaultPeerPort              = 179
	DefaultHoldTime              = 90 * time.Second
	DefaultConnectRetry          = 5 * time.Second
	DefaultIdleHoldAfterReset    = 3 * time.Second
	DefaultIdleHoldAfterResetMax = 60 * time.Second
	DefaultBFDInterval           = 300 * time.Millisecond
	DefaultBFDMultiplier         = 3
)

// Key is the configuration section this Config is read from, used in the
// names of fields in errors.
const Key = "bgp"

// WithDefaults returns a copy of c with every zero field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.ListenPort == 0 {
		c.ListenPort = DefaultListenPort
	}
	if c.RestartTime == 0 {
		c.RestartTime = DefaultRestartTime
	}
	if c.SelectionDeferral == 0 {
		c.SelectionDeferral = DefaultSelectionDeferral
	}
	peers := make([]PeerConfig, len(c.Peers))
	for i, p := range c.Peers {
		if p.LocalASN == 0 {
			p.LocalASN = c.ASN
		}
		if p.Port == 0 {
			p.Port = DefaultPeerPort
		}
		if p.HoldTime == 0 {
			p.HoldTime = DefaultHoldTime
		}
		if p.ConnectRetry == 0 {
			p.ConnectRetry = DefaultConnectRetry
		}
		if p.IdleHoldAfterReset == 0 {
			p.IdleHoldAfterReset = DefaultIdleHoldAfterReset
		}
		if p.IdleHoldAfterResetMax == 0 {
			p.IdleHoldAfterResetMax = max(DefaultIdleHoldAfterResetMax, p.IdleHoldAfterReset)
		}
		if p.BFDInterval == 0 {
			p.BFDInterval = DefaultBFDInterval
		}
		if p.BFDMultiplier == 0 {
			p.BFDMultiplier = DefaultBFDMultiplier
		}
		peers[i] = p
	}
	c.Peers = peers
	return c
}

// GracefulRestart tells whether the speaker advertises graceful restart.
func (c Config) GracefulRestart() bool { return c.RestartTime >= 0 }

// Validate checks a Config after WithDefaults, and names the first field
// and value it refuses: bgp.peer[1].hold_time = "1s": ...
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%s.%s = %s: %s", Key, field, quote(value), why))
	}
	if c.ASN == 0 {
		bad("asn", c.ASN, "required: this gateway's AS number, 1 to 4294967295")
	}
	if a, err := netip.ParseAddr(c.RouterID); err != nil || !a.Is4() || a.IsUnspecified() {
		bad("router_id", c.RouterID, "want an IPv4 address (the BGP identifier), also on IPv6-only gateways")
	}
	if c.ListenPort != -1 && (c.ListenPort < 1 || c.ListenPort > 65535) {
		bad("listen_port", c.ListenPort, "want a port 1 to 65535, or -1 for none")
	}
	if c.NextHopIPv4 != "" {
		if a, err := netip.ParseAddr(c.NextHopIPv4); err != nil || !a.Is4() {
			bad("next_hop_ipv4", c.NextHopIPv4, "want an IPv4 address, or empty for the session's own")
		}
	}
	if c.NextHopIPv6 != "" {
		if a, err := netip.ParseAddr(c.NextHopIPv6); err != nil || !a.Is6() || a.Is4In6() {
			bad("next_hop_ipv6", c.NextHopIPv6, "want an IPv6 address, or empty for the session's own")
		}
	}
	if c.RestartTime >= 0 && (c.RestartTime < time.Second || c.RestartTime > 4095*time.Second || c.RestartTime%time.Second != 0) {
		bad("restart_time", c.RestartTime, "want whole seconds from 1s to 4095s, or -1s for no graceful restart")
	}
	if c.SelectionDeferral < time.Second || c.SelectionDeferral > time.Hour || c.SelectionDeferral%time.Second != 0 {
		bad("restart_deferral", c.SelectionDeferral, "want whole seconds from 1s to 1h")
	}
	if c.ListenPort == -1 {
		for i, p := range c.Peers {
			if p.Passive {
				bad(fmt.Sprintf("peer[%d].passive", i), p.Passive, "a passive peer needs listen_port")
			}
		}
	}
	seen := map[netip.Addr]int{}
	for i, p := range c.Peers {
		f := func(name string) string { return fmt.Sprintf("peer[%d].%s", i, name) }
		a, err := netip.ParseAddr(p.Address)
		switch {
		case err != nil || p.Address != a.String() && p.Address != a.StringExpanded():
			bad(f("address"), p.Address, "want an IP address")
		case a.IsUnspecified() || a.IsMulticast() || a.Zone() != "":
			bad(f("address"), p.Address, "want a unicast address without a zone")
		default:
			if j, dup := seen[a]; dup {
				bad(f("address"), p.Address, fmt.Sprintf("the same peer as %s.peer[%d]", Key, j))
			}
			seen[a] = i
		}
		if p.ASN == 0 {
			bad(f("asn"), p.ASN, "required: the peer's AS number")
		}
		if p.Port < 1 || p.Port > 65535 {
			bad(f("port"), p.Port, "want a port 1 to 65535")
		}
		if p.PasswordFile != "" {
			if _, err := ReadPassword(p.PasswordFile); err != nil {
				bad(f("password_file"), p.PasswordFile, err.Error())
			}
		}
		if p.HoldTime < 3*time.Second || p.HoldTime > 65535*time.Second || p.HoldTime%time.Second != 0 {
			bad(f("hold_time"), p.HoldTime, "want whole seconds from 3s to 65535s")
		}
		if p.ConnectRetry < time.Second || p.ConnectRetry > time.Hour || p.ConnectRetry%time.Second != 0 {
			bad(f("connect_retry"), p.ConnectRetry, "want whole seconds from 1s to 1h")
		}
		// GoBGP counts it in whole seconds and takes 0 for its own 30s.
		if p.IdleHoldAfterReset < time.Second || p.IdleHoldAfterReset > time.Hour || p.IdleHoldAfterReset%time.Second != 0 {
			bad(f("idle_hold_after_reset"), p.IdleHoldAfterReset, "want whole seconds from 1s to 1h")
		} else if p.IdleHoldAfterResetMax < p.IdleHoldAfterReset || p.IdleHoldAfterResetMax > time.Hour || p.IdleHoldAfterResetMax%time.Second != 0 {
			bad(f("idle_hold_after_reset_max"), p.IdleHoldAfterResetMax, fmt.Sprintf("want whole seconds from idle_hold_after_reset (%v) to 1h", p.IdleHoldAfterReset))
		}
		if p.Multihop != 0 && (p.Multihop < 2 || p.Multihop > 255) {
			bad(f("multihop"), p.Multihop, "want a TTL from 2 to 255, or 0 for a directly connected peer")
		}
		if p.BFD && p.Multihop != 0 {
			bad(f("bfd"), p.BFD, "BFD is single-hop only (RFC 5881): not with multihop")
		}
		if p.BFDInterval < 10*time.Millisecond || p.BFDInterval > 60*time.Second || p.BFDInterval%time.Millisecond != 0 {
			bad(f("bfd_interval"), p.BFDInterval, "want whole milliseconds from 10ms to 60s")
		}
		if p.BFDMultiplier < 1 || p.BFDMultiplier > 255 {
			bad(f("bfd_multiplier"), p.BFDMultiplier, "want 1 to 255")
		}
	}
	prepend := func(field string, n int) {
		if n < 0 || n > MaxASPathPrepend {
			bad(field, n, fmt.Sprintf("want 0 to %d", MaxASPathPrepend))
			return
		}
		if n == 0 {
			return
		}
		for i, p := range c.Peers {
			if p.ASN == p.LocalASN {
				bad(field, n, fmt.Sprintf("%s.peer[%d] (%s) is iBGP (asn %d): it would drop a route with its own AS in the path; prepend only towards eBGP peers", Key, i, p.Address, p.ASN))
				return
			}
		}
	}
	prepend("as_path_prepend", c.ASPathPrepend)
	for name, pool := range c.Pools {
		for j, s := range pool.Communities {
			if _, err := ParseCommunity(s); err != nil {
				bad(fmt.Sprintf("pool.%s.communities[%d]", strconv.Quote(name), j), s, err.Error())
			}
		}
		if pool.ASPathPrepend != nil {
			prepend(fmt.Sprintf("pool.%s.as_path_prepend", strconv.Quote(name)), *pool.ASPathPrepend)
		}
	}
	return errors.Join(errs...)
}

func quote(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case time.Duration:
		return strconv.Quote(v.String())
	default:
		return fmt.Sprint(v)
	}
}

// maxPasswordLen is the kernel's TCP_MD5SIG_MAXKEYLEN.
const maxPasswordLen = 80

// ReadPassword reads a TCP-MD5 password file: its content without the
// trailing newline, 1 to 80 bytes.
func ReadPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" || len(s) > maxPasswordLen {
		return "", fmt.Errorf("the password must be 1 to %d bytes (has %d)", maxPasswordLen, len(s))
	}
	return s, nil
}

var wellKnownCommunities = map[string]uint32{
	"no-export":           0xFFFFFF01,
	"no-advertise":        0xFFFFFF02,
	"no-export-subconfed": 0xFFFFFF03,
	"blackhole":           0xFFFF029A,
}

// ParseCommunity reads "ASN:value" (each 0 to 65535) or a well-known
// community's name.
func ParseCommunity(s string) (uint32, error) {
	if v, ok := wellKnownCommunities[s]; ok {
		return v, nil
	}
	hi, lo, ok := strings.Cut(s, ":")
	if ok {
		h, err1 := strconv.ParseUint(hi, 10, 16)
		l, err2 := strconv.ParseUint(lo, 10, 16)
		if err1 == nil && err2 == nil {
			return uint32(h)<<16 | uint32(l), nil
		}
	}
	return 0, errors.New(`want "ASN:value" with both 0 to 65535, or no-export, no-advertise, no-export-subconfed, blackhole`)
}
