package main

import (
	"net/netip"
	"testing"
)

func TestBulkIP(t *testing.T) {
	first, second := bulkRanges[0].size(), bulkRanges[1].size()
	for _, c := range []struct {
		i    int
		want string
	}{
		{0, "198.19.1.0"},
		{255, "198.19.1.255"},
		{256, "198.19.2.0"},
		{first - 1, "198.19.255.254"},
		{first, "198.18.128.1"},
		{first + second - 1, "198.18.255.254"},
		{first + second, "198.18.64.1"},
		{maxServices - fixedCount - 1, "198.18.110.177"},
	} {
		got, err := bulkIP(c.i)
		if err != nil || got != netip.MustParseAddr(c.want) {
			t.Errorf("bulkIP(%d) = %v, %v; want %s", c.i, got, err, c.want)
		}
	}
	total := 0
	for _, r := range bulkRanges {
		total += r.size()
	}
	if total < maxServices-fixedCount {
		t.Errorf("bulk ranges hold %d addresses, fewer than the %d bulk Services of the largest size", total, maxServices-fixedCount)
	}
	if _, err := bulkIP(total); err == nil {
		t.Errorf("bulkIP(%d): no error past the last range", total)
	}
	// The canary and the changed Service must never share an address with a
	// bulk Service.
	for _, fixed := range []netip.Addr{canaryIP, changeIP} {
		for _, r := range bulkRanges {
			if ipv4Uint(fixed) >= ipv4Uint(r.first) && ipv4Uint(fixed) <= ipv4Uint(r.last) {
				t.Errorf("%v lies in bulk range %v-%v", fixed, r.first, r.last)
			}
		}
	}
}
