package nft

import (
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// dumpMessageSize is the size of the messages the kernel fills in a dump:
// the largest it makes (32 KiB less an skb's overhead, net/netlink) and
// rounds a receive buffer down to.
const dumpMessageSize = 32 << 10

// largeDumps makes the kernel answer the socket's dumps in messages of
// dumpMessageSize rather than a page. The kernel sizes a dump's messages
// by the largest buffer the socket ever received into, and netlink.Conn
// receives each message into a buffer of its exact size: so once, one
// message (the answer to a request for the ruleset's generation) is
// received into a buffer of that size. It matters for the sets nf_tables
// dumps by walking from their first element for every message: the
// traffic sets at 65,536 elements take eight times fewer walks.
func largeDumps(c *netlink.Conn) error {
	if _, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}); err != nil {
		return fmt.Errorf("ask the ruleset's generation: %w", err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, dumpMessageSize)
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		_, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
		return rerr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if rerr != nil {
		return fmt.Errorf("receive the ruleset's generation: %w", rerr)
	}
	return nil
}
