package vmtest

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// VLANTrunk is a one-VLAN switch in user space: frames a namespace sends on
// its access tap leave on a trunk link (a VM's tap) tagged with one 802.1Q
// VLAN id, and frames arriving on the trunk with that id reach the access
// tap untagged. The test hosts' kernel has no 802.1Q support (no VLAN
// interfaces, no VLAN filtering in bridges, no tc vlan action), so the tag
// is added and removed here; everything else is the kernels' own traffic.
//
// The access side is a tap rather than a veth: the kernel hands a tap
// without offloads complete frames with checksums filled in, where a veth
// peer read through a packet socket would show unfinished checksums and
// unsegmented TCP.
type VLANTrunk struct {
	vid    uint16
	access *os.File // tap queue in the access namespace
	trunk  *os.File // AF_PACKET socket bound to the trunk link

	// Tagged counts frames sent on the trunk, Untagged those delivered
	// to the access tap.
	Tagged, Untagged atomic.Int64

	closed  atomic.Bool
	wg      sync.WaitGroup
	errMu   sync.Mutex
	lastErr error
}

// StartVLANTrunk creates the tap accessTap in access (up, without
// addresses) and relays between it and the existing link trunkLink of
// trunk, tagging with vid. Close stops it and removes the tap.
func StartVLANTrunk(access *Netns, accessTap string, trunk *Netns, trunkLink string, vid uint16) (*VLANTrunk, error) {
	if vid < 1 || vid > 4094 {
		return nil, fmt.Errorf("vlan trunk: VLAN id %d outside 1..4094", vid)
	}
	l, err := trunk.nl.LinkByName(trunkLink)
	if err != nil {
		return nil, fmt.Errorf("vlan trunk: %s in %s: %w", trunkLink, trunk.Name, err)
	}
	var fd int
	err = trunk.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("vlan trunk: packet socket in %s: %w", trunk.Name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vlan trunk: binding to %s: %w", trunkLink, err)
	}
	// The receiving kernel moves an arriving frame's VLAN tag out of the
	// data into metadata, delivered with PACKET_AUXDATA.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vlan trunk: PACKET_AUXDATA: %w", err)
	}
	// A non-blocking descriptor joins Go's poller, so Close ends a
	// pending read.
	trunkFile := os.NewFile(uintptr(fd), "packet:"+trunkLink)
	accessFile, err := access.openTap(accessTap)
	if err != nil {
		trunkFile.Close()
		return nil, err
	}
	v := &VLANTrunk{vid: vid, access: accessFile, trunk: trunkFile}
	v.wg.Add(2)
	go v.toTrunk()
	go v.toAccess()
	return v, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Close stops the relay and removes the access tap. It returns the first
// error the relay met, if any, besides the closing itself.
func (v *VLANTrunk) Close() error {
	v.closed.Store(true)
	v.access.Close()
	v.trunk.Close()
	v.wg.Wait()
	v.errMu.Lock()
	defer v.errMu.Unlock()
	return v.lastErr
}

func (v *VLANTrunk) fail(err error) {
	// Closing the files is how Close ends the loops.
	if v.closed.Load() {
		return
	}
	v.errMu.Lock()
	defer v.errMu.Unlock()
	if v.lastErr == nil {
		v.lastErr = err
	}
}

// toTrunk tags every frame of the access tap.
func (v *VLANTrunk) toTrunk() {
	defer v.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := v.access.Read(buf[4:])
		if err != nil {
			v.fail(fmt.Errorf("vlan trunk: reading the access tap: %w", err))
			return
		}
		if n < 14 {
			continue
		}
		// Destination and source MAC move 4 bytes forward; the tag
		// (TPID 0x8100, priority 0, the VLAN id) goes between them and
		// the frame's own EtherType.
		frame := buf[:n+4]
		copy(frame[0:12], frame[4:16])
		binary.BigEndian.PutUint16(frame[12:], unix.ETH_P_8021Q)
		binary.BigEndian.PutUint16(frame[14:], v.vid)
		if _, err := v.trunk.Write(frame); err != nil {
			v.fail(fmt.Errorf("vlan trunk: sending on the trunk: %w", err))
			return
		}
		v.Tagged.Add(1)
	}
}

// toAccess delivers the trunk's frames of the VLAN, untagged.
func (v *VLANTrunk) toAccess() {
	defer v.wg.Done()
	rc, err := v.trunk.SyscallConn()
	if err != nil {
		v.fail(err)
		return
	}
	buf := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(64))
	for {
		var n, oobn int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, from, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		})
		if err != nil {
			v.fail(err)
			return
		}
		if rerr != nil {
			v.fail(fmt.Errorf("vlan trunk: receiving on the trunk: %w", rerr))
			return
		}
		// Frames this relay (or anyone) sends out show up as outgoing.
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		frame, vid, tagged := untag(buf[:n], oob[:oobn])
		if !tagged || vid != v.vid {
			continue
		}
		if _, err := v.access.Write(frame); err != nil {
			v.fail(fmt.Errorf("vlan trunk: writing to the access tap: %w", err))
			return
		}
		v.Untagged.Add(1)
	}
}

// untag returns the frame without its 802.1Q tag and the tag's VLAN id.
// The tag is either in the auxiliary data (struct tpacket_auxdata:
// tp_status at offset 0, tp_vlan_tci at 16) or, when the kernel left it,
// in the frame itself.
func untag(frame, oob []byte) ([]byte, uint16, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err == nil {
		for _, m := range msgs {
			if m.Header.Level != unix.SOL_PACKET || m.Header.Type != unix.PACKET_AUXDATA || len(m.Data) < 20 {
				continue
			}
			if binary.NativeEndian.Uint32(m.Data[0:])&unix.TP_STATUS_VLAN_VALID != 0 {
				return frame, binary.NativeEndian.Uint16(m.Data[16:]) & 0x0fff, true
			}
		}
	}
	if len(frame) >= 18 && binary.BigEndian.Uint16(frame[12:]) == unix.ETH_P_8021Q {
		vid := binary.BigEndian.Uint16(frame[14:]) & 0x0fff
		copy(frame[4:16], frame[0:12])
		return frame[4:], vid, true
	}
	return frame, 0, false
}
