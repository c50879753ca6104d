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
	return FailoverBy(topo, dst, traffic, func() (time.Time, error) { return topo.Fail(fail) }, ready)
}

// FailoverBy is Failover with another failure: fail injects it (a drain,
// say) and returns the moment the flows are followed from.
func FailoverBy(topo *Topology, dst netip.AddrPort, traffic Traffic, fail func() (time.Time, error), ready func() error) (Result, error) {
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
	at, err := fail()
	if err != nil {
		return Result{}, err
	}
	run.Failed(at)
	run.Settle()
	established = true
	return run.Stop(), nil
}

// Return is one measurement of a gateway's failure and its return.
type Return struct {
	// Failover is the result after the failure (as Failover's), Back
	// after the return: every flow, those of before the failure and
	// those opened after it, and the stalls since the return.
	Failover, Back Result
}

func (r Return) String() string {
	return "after the failure: " + r.Failover.String() + "\nafter the return: " + r.Back.String()
}

// FailAndReturn runs Failover's measurement, then, with the traffic still
// going, opens as many new flows again (through the survivors), calls
// more (if not nil) once they echo, and brings gateway fail back:
// Topology.Return, then back, which starts its programs and returns once
// the gateway has taken its part back. Every flow is followed until kept
// or lost: stalls measured from the return, survival from the moment
// back returned.
func FailAndReturn(topo *Topology, dst netip.AddrPort, traffic Traffic, fail int, ready, more, back func() error) (Return, error) {
	var out Return
	stop, err := ServeEcho(topo.Endpoints, Endpoints, EndpointPort)
	if err != nil {
		return out, err
	}
	defer stop()
	run, err := Start(topo.Client, dst, traffic)
	if err != nil {
		return out, err
	}
	defer run.Stop()
	if err := run.Established(time.Minute); err != nil {
		return out, fmt.Errorf("failover: before the failure: %w", err)
	}
	if ready != nil {
		if err := ready(); err != nil {
			return out, fmt.Errorf("failover: before the failure: %w", err)
		}
	}
	at, err := topo.Fail(fail)
	if err != nil {
		return out, err
	}
	run.Failed(at)
	run.Settle()
	out.Failover = run.Result()
	if err := run.Add(topo.Client, dst, traffic.TCP, traffic.UDP); err != nil {
		return out, fmt.Errorf("failover: after the failure: %w", err)
	}
	if err := run.Established(time.Minute); err != nil {
		return out, fmt.Errorf("failover: after the failure: %w", err)
	}
	if more != nil {
		if err := more(); err != nil {
			return out, fmt.Errorf("failover: after the failure: %w", err)
		}
	}
	run.RestartStalls()
	if err := topo.Return(fail); err != nil {
		return out, err
	}
	if err := back(); err != nil {
		return out, fmt.Errorf("failover: the return: %w", err)
	}
	// Kept: echoing Survive after the gateway took its part back.
	run.Failed(time.Now())
	run.Settle()
	out.Back = run.Stop()
	return out, nil
}
