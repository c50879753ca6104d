package vmtest

import (
	"strings"
	"testing"
)

// TestConfigDefaults: what a Config leaves empty comes from the
// environment or the defaults, and counting instructions (-icount) runs
// TCG on one thread unless an accelerator is named.
func TestConfigDefaults(t *testing.T) {
	for _, c := range []struct {
		name           string
		cfg            Config
		env            map[string]string
		accel, icount  string
		memoryMB, cpus int
	}{
		{name: "defaults", accel: "tcg,thread=multi", memoryMB: 1024, cpus: 1},
		{name: "icount from the environment", env: map[string]string{"NFTGATE_VMTEST_ICOUNT": "shift=0,sleep=on"},
			accel: "tcg,thread=single", icount: "shift=0,sleep=on", memoryMB: 1024, cpus: 1},
		{name: "icount in the config", cfg: Config{Icount: "shift=1", MemoryMB: 512, CPUs: 2},
			accel: "tcg,thread=single", icount: "shift=1", memoryMB: 512, cpus: 2},
		{name: "accelerator named", cfg: Config{Icount: "shift=0"}, env: map[string]string{"NFTGATE_VMTEST_ACCEL": "tcg"},
			accel: "tcg", icount: "shift=0", memoryMB: 1024, cpus: 1},
		{name: "CPUs from the environment", env: map[string]string{"NFTGATE_VMTEST_CPUS": "2"},
			accel: "tcg,thread=multi", memoryMB: 1024, cpus: 2},
		{name: "CPUs in the config win", cfg: Config{CPUs: 3}, env: map[string]string{"NFTGATE_VMTEST_CPUS": "2"},
			accel: "tcg,thread=multi", memoryMB: 1024, cpus: 3},
		{name: "kvm from the environment", env: map[string]string{"NFTGATE_VMTEST_ACCEL": "kvm"},
			accel: "kvm", memoryMB: 1024, cpus: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			if err := cfg.setDefaults(func(k string) string { return c.env[k] }); err != nil {
				t.Fatal(err)
			}
			if cfg.Accel != c.accel || cfg.Icount != c.icount || cfg.MemoryMB != c.memoryMB || cfg.CPUs != c.cpus ||
				cfg.QEMU != "qemu-system-x86_64" {
				t.Errorf("got accel %q icount %q memory %d CPUs %d QEMU %q, want %q %q %d %d qemu-system-x86_64",
					cfg.Accel, cfg.Icount, cfg.MemoryMB, cfg.CPUs, cfg.QEMU, c.accel, c.icount, c.memoryMB, c.cpus)
			}
		})
	}
}

// TestConfigBadCPUs: a number of vCPUs from the environment that is not
// one is an error naming the variable and the value, not a silent default.
func TestConfigBadCPUs(t *testing.T) {
	for _, v := range []string{"two", "0", "-1"} {
		var cfg Config
		err := cfg.setDefaults(func(k string) string {
			if k == "NFTGATE_VMTEST_CPUS" {
				return v
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "NFTGATE_VMTEST_CPUS=\""+v+"\"") {
			t.Errorf("NFTGATE_VMTEST_CPUS=%q: got %v, want an error naming it", v, err)
		}
	}
}
