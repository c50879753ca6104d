//go:build tools

// Package gok pins the gokrazy gok tool that builds the nftgate appliance
// image. It lives in its own module so the main module's build, vet and test
// never see it or its dependencies.
package gok

import _ "github.com/gokrazy/tools/cmd/gok"
