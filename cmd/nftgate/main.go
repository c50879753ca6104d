// Command nftgate turns a box into the edge gateway of a Kubernetes cluster:
// it watches Services and EndpointSlices and keeps nftables verdict maps for
// them in the kernel.
//
//	nftgate [flags]            run the gateway
//	nftgate render [flags]     print the ruleset the gateway would program
//	nftgate cleanup [flags]    remove everything nftgate programmed
//	nftgate drain [flags]      take the running nftgate out of service, then let it exit
//	nftgate version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "run"
	if len(args) > 0 {
		switch args[0] {
		case "run", "render", "cleanup", "version", "drain":
			cmd, args = args[0], args[1:]
		}
	}
	if cmd == "drain" {
		err := drainCommand(args, os.Stdout)
		var fe flagError
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &fe):
			return 2
		case err != nil:
			fmt.Fprintln(os.Stderr, "nftgate:", err)
			return 1
		}
		return 0
	}
	if cmd == "version" {
		fmt.Println("nftgate", version)
		return 0
	}
	cfg, _, err := loadConfig("nftgate "+cmd, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var fe flagError
	if errors.As(err, &fe) {
		return 2 // the flag package has said what is wrong, with usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftgate:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "render":
		err = render(ctx, cfg, os.Stdout)
	case "cleanup":
		err = cleanup(cfg)
	default:
		err = serve(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftgate:", err)
		// Never 0 on failure: gokrazy takes exit 0 as "stopped on
		// purpose" and would not restart the gateway.
		return 1
	}
	return 0
}
