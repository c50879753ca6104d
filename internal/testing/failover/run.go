package failover

import (
	"fmt"
	"net/netip"
	"time"
)

// Failover runs one measurement in topo: echo servers on the endpoints,
// the traffic to dst, ready (if not nil) once every flow echoes (to wait
// until the standby holds the flows), then gateway fail dies and the flows
// are followed until each is kept or lost.
func Failover(topo *Topology, dst netip.AddrPort, traffic Traffic, fail int, ready func() error) (Result, error) {
	stop, err := ServeEcho(topo.Endpoints, Endpoints, EndpointPort)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	run, err := Start(topo.Client, dst, traffic)
	if err != nil {
		return Result{}, err
	}
	established := false
	defer func() {
		if !established {
			run.Stop()
		}
	}()
	if err := run.Established(time.Minute); err != nil {
		return Result{}, fmt.Errorf("failover: before the failure: %w", err)
	}
	if ready != nil {
		if err := ready(); err != nil {
			return Result{}, fmt.Errorf("failover: before the failure: %w", err)
		}
	}
	at, err := topo.Fail(fail)
	if err != nil {
		return Result{}, err
	}
	run.Failed(at)
	run.Settle()
	established = true
	return run.Stop(), nil
}
