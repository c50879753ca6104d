package statesync

import (
	"context"
	"errors"
)

// Temporary stand-in for the conntrack netlink Kernel, so that the binary
// builds before it lands; the real conntrack.go replaces this file.

// ConntrackOptions are NewConntrack's options.
type ConntrackOptions struct {
	// NetNS is the network namespace's file descriptor; 0 is the current.
	NetNS int
}

// Conntrack is the Kernel on ctnetlink.
type Conntrack struct{}

var errNoConntrack = errors.New("statesync: the conntrack netlink kernel side is not built into this binary")

// NewConntrack opens the conntrack netlink sockets.
func NewConntrack(ConntrackOptions) (*Conntrack, error) { return nil, errNoConntrack }

func (*Conntrack) Listen(context.Context, func([]Event), func(int)) error { return errNoConntrack }
func (*Conntrack) Dump(func(Entry)) error                                 { return errNoConntrack }
func (*Conntrack) Write(puts, dels []Entry) []error                       { return make([]error, len(puts)+len(dels)) }
func (*Conntrack) Adopt(es []Entry) []error                               { return make([]error, len(es)) }

// Close closes the sockets.
func (*Conntrack) Close() error { return nil }
