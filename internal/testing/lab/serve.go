package lab

import "net"

// ServeConns accepts connections on ln until it is closed and runs handle
// for each in its own goroutine, closing the connection when handle
// returns. It returns at once.
func ServeConns(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// ServeDatagrams answers every datagram on pc with answer(request), sent
// back to its sender from pc's address, until pc is closed. The request
// slice is reused after answer returns. It returns at once.
func ServeDatagrams(pc net.PacketConn, answer func(req []byte) []byte) {
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			// A failed answer (no route back for a moment) loses that
			// datagram only.
			_, _ = pc.WriteTo(answer(buf[:n]), from)
		}
	}()
}
