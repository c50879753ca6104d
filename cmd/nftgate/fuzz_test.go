package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// FuzzRenderManifest: any manifest file goes through decoding, the model,
// the ruleset and the text of `nftgate render` without a panic; the script
// is the same every time, and nft accepts it (checked in a network
// namespace of its own, when root).
func FuzzRenderManifest(f *testing.F) {
	empty, err := renderOnce(f, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		script, err := renderOnce(t, data)
		if err != nil {
			return // refused, by name: nothing rendered
		}
		again, err := renderOnce(t, data)
		if err != nil || !bytes.Equal(script, again) {
			t.Fatalf("a second render differs (%v):\n%s\n---\n%s", err, script, again)
		}
		if bytes.Equal(script, empty) || os.Geteuid() != 0 {
			return // the skeleton alone (checked by the tests), or no namespaces without root
		}
		// A fresh network namespace, gone when nft exits.
		cmd := exec.Command("unshare", "--net", "nft", "-c", "-f", "-")
		cmd.Stdin = bytes.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -c -f refused the rendering: %v\n%s\nmanifest:\n%q\nscript:\n%s", err, out, data, script)
		}
	})
}

// renderOnce runs `nftgate render` on a directory holding one manifest
// file of the given content.
func renderOnce(tb testing.TB, data []byte) ([]byte, error) {
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), data, 0o644); err != nil {
		tb.Fatal(err)
	}
	cfg := defaults()
	cfg.Manifests, cfg.NodeName = dir, "gw"
	if err := cfg.validate(); err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	err := render(context.Background(), &cfg, &out)
	return out.Bytes(), err
}

// FuzzConfig: any config file is read without a panic; one that is
// accepted passes its own checks again, and its canonical form (the same
// config written back as TOML) reads back to the same config.
func FuzzConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		cfg, err := loadConfigText(t, data)
		if err != nil {
			return
		}
		again := *cfg
		if err := again.validate(); err != nil {
			t.Fatalf("an accepted config fails its own checks: %v\n%q", err, data)
		}
		var canon bytes.Buffer
		if err := toml.NewEncoder(&canon).Encode(cfg); err != nil {
			t.Fatalf("an accepted config cannot be written back: %v\n%q", err, data)
		}
		back, err := loadConfigText(t, canon.Bytes())
		if err != nil {
			t.Fatalf("the canonical form of an accepted config is refused: %v\nconfig:\n%q\ncanonical:\n%s", err, data, canon.Bytes())
		}
		if !reflect.DeepEqual(back, cfg) {
			t.Fatalf("the canonical form reads back differently:\n%+v\nwant\n%+v\ncanonical:\n%s", back, cfg, canon.Bytes())
		}
	})
}

func loadConfigText(t *testing.T, data []byte) (*Config, error) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := loadConfig("nftgate", []string{"--config", path})
	return cfg, err
}

// watchdog turns an input that takes far longer than any should into a
// crash the fuzzer records: go test's fuzzing has no time limit per input,
// and a hang would only stall it.
func watchdog(data []byte) *time.Timer {
	return time.AfterFunc(20*time.Second, func() { panic(fmt.Sprintf("one input took over 20 s: %q", data)) })
}
