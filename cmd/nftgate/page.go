package main

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/loop"
)

// Bounds of the page's history and timeline keys.
const (
	minHistoryStep   = time.Second
	maxHistoryStep   = time.Hour
	maxHistoryPoints = 1440
	maxHistoryPorts  = 1000000
	maxTimeline      = 100000
)

// pageFlags registers the flags of the page's traffic history.
func pageFlags(fs *flag.FlagSet, cfg *Config) {
	fs.Var(&cfg.TrafficHistoryStep, "traffic-history-step", "`interval` between two points of the traffic history (see config.toml)")
}

// validatePage checks the page's keys.
func (c *Config) validatePage(bad func(key, format string, args ...any)) {
	if d := time.Duration(c.TrafficHistoryStep); d < minHistoryStep || d > maxHistoryStep {
		bad("traffic_history_step", "%s is not between %s and %s", c.TrafficHistoryStep, minHistoryStep, maxHistoryStep)
	}
	if c.TrafficHistoryPoints < 1 || c.TrafficHistoryPoints > maxHistoryPoints {
		bad("traffic_history_points", "%d is not between 1 and %d", c.TrafficHistoryPoints, maxHistoryPoints)
	}
	if c.TrafficHistoryPorts < 0 || c.TrafficHistoryPorts > maxHistoryPorts {
		bad("traffic_history_ports", "%d is not between 0 (no history) and %d", c.TrafficHistoryPorts, maxHistoryPorts)
	}
	if c.TimelineEvents < 1 || c.TimelineEvents > maxTimeline {
		bad("timeline_events", "%d is not between 1 and %d", c.TimelineEvents, maxTimeline)
	}
}

// history is the traffic history the page charts, nil when
// traffic_history_ports is 0.
func (c *Config) history() *appliance.History {
	if c.TrafficHistoryPorts == 0 {
		return nil
	}
	return appliance.NewHistory(time.Duration(c.TrafficHistoryStep), c.TrafficHistoryPoints, c.TrafficHistoryPorts)
}

// eventMessages are the log messages that are events of the gateway's
// timeline, by kind: what the rooms already log when Services are
// refused, addresses announced, peers come and go. Syncs and drift
// repairs come from the sync loop (syncEvent). Each message is checked to
// be logged somewhere (TestEventMessagesAreLogged).
var eventMessages = map[string]string{
	"l2: announced":                appliance.EventAnnouncement,
	"l2: no longer announced":      appliance.EventAnnouncement,
	"BGP announcement failed":      appliance.EventAnnouncement,
	"bgp: session up":              appliance.EventAnnouncement,
	"bgp: session down":            appliance.EventAnnouncement,
	"gateways: peer alive":         appliance.EventFailover,
	"gateways: peer dead":          appliance.EventFailover,
	"gateways: addresses taken":    appliance.EventFailover,
	"gateways: addresses released": appliance.EventFailover,
	"gateways: faulty; handing over what a fit peer can hold": appliance.EventFailover,
	"gateways: fit again": appliance.EventFailover,
	"gateways: on standby: faulty while a fit peer lives":                         appliance.EventFailover,
	"gateways: off standby":                                                       appliance.EventFailover,
	"statesync: peer up, full resync":                                             appliance.EventFailover,
	"statesync: peer down; custody of its entries":                                appliance.EventFailover,
	"this gateway now writes LoadBalancer addresses":                              appliance.EventFailover,
	"this gateway no longer writes LoadBalancer addresses":                        appliance.EventFailover,
	"service not applied; its previous state stays in effect":                     appliance.EventRefused,
	"the kernel refused the service's rules; its last good state stays in effect": appliance.EventRefused,
	"manifest not applied; its previous content stays in effect":                  appliance.EventRefused,
	"gateways: hello refused":                                                     appliance.EventRefused,
	"statesync: entry from peer refused, nothing written":                         appliance.EventRefused,
	"LoadBalancer address":                                                        appliance.EventRefused,
}

// syncEvent adds to the timeline the syncs that changed something or
// failed, and the drift repairs.
func syncEvent(events *appliance.Events) func(loop.Event) {
	return func(ev loop.Event) {
		kind := "partial"
		if ev.Full {
			kind = "full"
		}
		switch {
		case ev.Err != nil:
			events.Add(appliance.Event{Kind: appliance.EventSync, Level: "ERROR", Message: kind + " sync failed; the rules in the kernel are unchanged",
				Attrs: map[string]string{"err": ev.Err.Error()}})
		case ev.Repair != "" || len(ev.Result.Drift) > 0:
			attrs := map[string]string{"messages": strconv.Itoa(ev.Result.Messages)}
			if ev.Repair != "" {
				attrs["why"] = ev.Repair
			}
			if len(ev.Result.Drift) > 0 {
				attrs["drift"] = fmt.Sprint(ev.Result.Drift)
			}
			events.Add(appliance.Event{Kind: appliance.EventRepair, Level: "WARN", Message: "kernel ruleset had drifted; repaired", Attrs: attrs})
		case ev.Changed > 0 || (ev.Full && ev.Result.Messages > 0):
			events.Add(appliance.Event{Kind: appliance.EventSync, Message: kind + " sync",
				Attrs: map[string]string{"services": strconv.Itoa(ev.Changed), "messages": strconv.Itoa(ev.Result.Messages), "duration": ev.Result.Duration.String()}})
		}
	}
}
