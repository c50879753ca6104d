// Package lockedbuf is a text buffer that one goroutine (a logger, a
// command's output) writes while a test reads it.
package lockedbuf

import (
	"strings"
	"sync"
)

// Buffer is a strings.Builder behind a mutex. The zero value is empty and
// ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
