package l2

import (
	"fmt"
	"strings"
	"time"
)

// Config is the [l2] section of nftgate's configuration. A zero value of a
// field means its default (see WithDefaults); Validate names the field and
// value it refuses.
type Config struct {
	// Interfaces are the network interfaces on which the gateway answers
	// ARP (IPv4) and neighbour solicitations (IPv6) for the addresses it
	// serves, and sends gratuitous ARP and unsolicited neighbour
	// advertisements. Each address is announced on every interface listed.
	Interfaces []string `toml:"interfaces" json:"interfaces"`
	// GratuitousCount is how many gratuitous ARP / unsolicited neighbour
	// advertisements are sent for an address when it starts being
	// announced (also after every start of the process): the first at
	// once, the others GratuitousInterval apart. Default 3, at most 100.
	GratuitousCount int `toml:"gratuitous_count" json:"gratuitous_count"`
	// GratuitousInterval is the wait between two gratuitous messages for
	// the same address. Default 1s, from 10ms to 1m.
	GratuitousInterval time.Duration `toml:"gratuitous_interval" json:"gratuitous_interval"`
}

// Defaults of the fields a zero value leaves to the announcer.
const (
	DefaultGratuitousCount    = 3
	DefaultGratuitousInterval = time.Second
)

// Key is the configuration section this Config is read from, used in the
// names of fields in errors.
const Key = "l2"

// WithDefaults returns a copy of c with every zero field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.GratuitousCount == 0 {
		c.GratuitousCount = DefaultGratuitousCount
	}
	if c.GratuitousInterval == 0 {
		c.GratuitousInterval = DefaultGratuitousInterval
	}
	c.Interfaces = append([]string(nil), c.Interfaces...)
	return c
}

// maxIfNameLen is IFNAMSIZ less the terminating NUL.
const maxIfNameLen = 15

// Validate checks a Config after WithDefaults and returns an error naming
// the first field and value it refuses. It does not look at the machine:
// whether each interface exists is New's concern.
func (c Config) Validate() error {
	if len(c.Interfaces) == 0 {
		return fmt.Errorf("%s.interfaces = []: want at least one interface", Key)
	}
	seen := map[string]int{}
	for i, name := range c.Interfaces {
		field := fmt.Sprintf("%s.interfaces[%d] = %q", Key, i, name)
		switch {
		case name == "" || name == "." || name == "..":
			return fmt.Errorf("%s: not an interface name", field)
		case len(name) > maxIfNameLen:
			return fmt.Errorf("%s: interface names have at most %d bytes", field, maxIfNameLen)
		case strings.ContainsAny(name, "/: \t\n\x00"):
			return fmt.Errorf("%s: an interface name has no '/', ':' or white space", field)
		}
		if j, ok := seen[name]; ok {
			return fmt.Errorf("%s: listed twice (also %s.interfaces[%d])", field, Key, j)
		}
		seen[name] = i
	}
	if c.GratuitousCount < 1 || c.GratuitousCount > 100 {
		return fmt.Errorf("%s.gratuitous_count = %d: want 1 to 100", Key, c.GratuitousCount)
	}
	if c.GratuitousInterval < 10*time.Millisecond || c.GratuitousInterval > time.Minute {
		return fmt.Errorf("%s.gratuitous_interval = %q: want 10ms to 1m", Key, c.GratuitousInterval.String())
	}
	return nil
}
