// Command connrate measures new TCP connections per second between lab
// namespaces: "serve" answers every connection with one line and closes it
// first (so the server holds TIME_WAIT, as a web backend does), "dial" opens
// connections from parallel workers (connect, read the line, close) and
// prints how many completed, how many took a second or more (a SYN lost or
// refused and sent again: a stall), and the latency percentiles.
//
//	ip netns exec backend connrate serve -listen 0.0.0.0:8080
//	ip netns exec client connrate dial -to 198.19.0.10:80 -from 198.18.1.2,198.18.1.3 -c 8 -d 15s
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: connrate serve|dial [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "dial":
		err = dial(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "connrate:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "0.0.0.0:8080", "address to listen on")
	fs.Parse(args)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			// Who the server saw, so a test can tell the source.
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}()
	}
}

func dial(args []string) error {
	fs := flag.NewFlagSet("dial", flag.ExitOnError)
	to := fs.String("to", "", "address:port to connect to")
	from := fs.String("from", "", "comma-separated source addresses; worker i uses the (i mod n)th")
	workers := fs.Int("c", 8, "parallel workers")
	dur := fs.Duration("d", 10*time.Second, "how long to run")
	fs.Parse(args)
	var sources []net.IP
	for _, s := range strings.Split(*from, ",") {
		if s != "" {
			sources = append(sources, net.ParseIP(s))
		}
	}
	var ok, failed, stalled atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	end := time.Now().Add(*dur)
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		d := net.Dialer{Timeout: 5 * time.Second}
		if len(sources) > 0 {
			d.LocalAddr = &net.TCPAddr{IP: sources[w%len(sources)]}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(end) {
				t0 := time.Now()
				c, err := d.Dial("tcp", *to)
				local := ""
				if err == nil {
					local = c.LocalAddr().String()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					_, err = bufio.NewReader(c).ReadString('\n')
					c.Close()
				}
				el := time.Since(t0)
				if err != nil {
					failed.Add(1)
					continue
				}
				ok.Add(1)
				if el >= time.Second {
					stalled.Add(1)
					fmt.Fprintf(os.Stderr, "stalled %s %v at %s\n", local, el, t0.Format("15:04:05.000000"))
				}
				mine = append(mine, el)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(float64(len(lat)-1)*p)]
	}
	fmt.Printf("conns=%d rate=%.0f/s failed=%d stalled=%d p50=%v p99=%v max=%v\n",
		ok.Load(), float64(ok.Load())/dur.Seconds(), failed.Load(), stalled.Load(),
		pct(0.5).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond))
	return nil
}
