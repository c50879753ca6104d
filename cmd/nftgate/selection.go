package main

import (
	"flag"

	"github.com/nftgate/nftgate/model"
)

// selectionFlags registers the endpoint selection's flag.
func selectionFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.EndpointSelection, "endpoint-selection", cfg.EndpointSelection, "how a new connection's endpoint is chosen: `hash` or maglev (see config.toml)")
}

// validateSelection checks endpoint_selection.
func (c *Config) validateSelection(bad func(key, format string, args ...any)) {
	if c.EndpointSelection != model.SelectionHash && c.EndpointSelection != model.SelectionMaglev {
		bad("endpoint_selection", "%q is not %q or %q", c.EndpointSelection, model.SelectionHash, model.SelectionMaglev)
	}
}

// defaultSelection is endpoint_selection's default.
const defaultSelection = model.SelectionHash
