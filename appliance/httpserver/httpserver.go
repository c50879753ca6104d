// Package httpserver builds the gateway's HTTP servers (the status server
// and the healthCheckNodePort servers) with limits on how long a client
// may hold a connection and how large its request header may be, so that
// slow or idle clients cannot exhaust the process's file descriptors.
package httpserver

import (
	"net/http"
	"time"
)

// Limits bound what one connection may cost the server.
type Limits struct {
	// ReadHeaderTimeout is how long a client has to send a request's
	// header, from the moment the connection is accepted or becomes active
	// again (a slow-loris client is cut off here).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds handling and writing a response. It must exceed
	// the longest profile /debug/pprof/ serves (30 s by default).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this
	// long.
	IdleTimeout time.Duration
	// MaxHeaderBytes limits the size of a request header; larger headers
	// get 431.
	MaxHeaderBytes int
}

// Default is what the gateway's servers use. The status page polls every
// few seconds, so a minute of keep-alive serves it; a header of 16 KiB holds
// any browser's request with credentials.
var Default = Limits{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       60 * time.Second,
	MaxHeaderBytes:    16 << 10,
}

// orDefault fills zero fields from Default.
func (l Limits) orDefault() Limits {
	d := Default
	if l.ReadHeaderTimeout > 0 {
		d.ReadHeaderTimeout = l.ReadHeaderTimeout
	}
	if l.ReadTimeout > 0 {
		d.ReadTimeout = l.ReadTimeout
	}
	if l.WriteTimeout > 0 {
		d.WriteTimeout = l.WriteTimeout
	}
	if l.IdleTimeout > 0 {
		d.IdleTimeout = l.IdleTimeout
	}
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	return d
}

// New returns a server for h with limits l; zero fields of l take
// Default's values.
func New(h http.Handler, l Limits) *http.Server {
	l = l.orDefault()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}
