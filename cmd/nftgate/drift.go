package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/nft"
)

// watchDrift follows the kernel's nf_tables notifications until ctx ends:
// when another program changes or deletes nftgate's tables, a full sync
// repairs them at once rather than at the next reconcile_interval, which
// stays as the backstop. Without the notifications that backstop is all
// there is, and every reconcile reads the tables back.
func watchDrift(ctx context.Context, prog *nft.Programmer, syncer *loop.Syncer, reg prometheus.Registerer, log *slog.Logger) {
	detected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftgate", Name: "drift_detected_total",
		Help: "Changes of nftgate's tables by another program that the kernel announced (cause=changed), and losses of the announcements (cause=lost); each asks for a full sync at once.",
	}, []string{"cause"})
	delayed := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "nftgate", Name: "drift_repairs_delayed_total",
		Help: "Repairs asked for within min_repair_interval of the previous one, which waited for it.",
	}, func() float64 { _, d := syncer.RepairCounts(); return float64(d) })
	for _, c := range []string{"changed", "lost"} {
		detected.WithLabelValues(c)
	}
	reg.MustRegister(detected, delayed)
	err := prog.Watch(ctx, func(d nft.Drift) {
		if d.Lost {
			detected.WithLabelValues("lost").Inc()
			log.Debug("nf_tables notifications lost; the next full sync reads the tables back unless nothing but nftgate committed")
		} else {
			detected.WithLabelValues("changed").Inc()
			log.Warn("another program changed nftgate's tables; repairing", "drift", d.String())
		}
		syncer.RequestRepair(d.String())
	})
	if err != nil {
		log.Error("nf_tables notifications unavailable: drift is repaired only at reconcile_interval", "err", err)
	}
}
