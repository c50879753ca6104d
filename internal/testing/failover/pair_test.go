package failover_test

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// clientServer returns two hosts of a new lab linked directly, the
// client at .1 and the server at .2 of the /24 net; it returns the
// server's address.
func clientServer(t *testing.T, net string) (client, server *lab.Host, serverAddr netip.Addr) {
	t.Helper()
	l := labtest.New(t)
	client, err := l.AddHost("client")
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.AddHost("server")
	if err != nil {
		t.Fatal(err)
	}
	base := netip.MustParsePrefix(net).Masked().Addr()
	c, s := base.Next(), base.Next().Next()
	if _, err := l.Link(client, []netip.Prefix{netip.PrefixFrom(c, 24)}, server, []netip.Prefix{netip.PrefixFrom(s, 24)}); err != nil {
		t.Fatal(err)
	}
	return client, server, s
}
