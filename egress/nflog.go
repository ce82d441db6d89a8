package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Match is one logged (rate-limited) packet that hit a blocked class.
type Match struct {
	Class   string
	Src     netip.Addr
	Dst     netip.Addr
	Proto   string // tcp, udp, icmp, icmpv6 or a number
	DstPort uint16 // 0 when the protocol has none
}

// Destination renders the destination as the readiness report shows it.
func (m Match) Destination() string {
	if m.DstPort == 0 {
		return m.Dst.String() + "/" + m.Proto
	}
	return netip.AddrPortFrom(m.Dst, m.DstPort).String() + "/" + m.Proto
}

const (
	nfnlSubsysULOG   = 4
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
	nfulaPrefix      = 10
)

// nflogConn is a netlink socket bound to one NFLOG group. Close unblocks a
// pending Read.
type nflogConn struct {
	f     *os.File
	group uint16
}

// openNFLOG binds the group in the calling thread's network namespace.
func openNFLOG(group uint16) (*nflogConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nflog socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nflog bind: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	c := &nflogConn{f: os.NewFile(uintptr(fd), "nflog"), group: group}
	bind := []byte{nfulnlCfgCmdBind}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, 256) // copy range: headers are enough
	mode[4] = nfulnlCopyPacket
	for i, attr := range []struct {
		typ  uint16
		data []byte
	}{{nfulaCfgCmd, bind}, {nfulaCfgMode, mode}} {
		if err := c.config(uint32(i+1), attr.typ, attr.data); err != nil {
			c.Close()
			return nil, fmt.Errorf("nflog group %d config: %w", group, err)
		}
	}
	return c, nil
}

func (c *nflogConn) config(seq uint32, attrType uint16, data []byte) error {
	alen := 4 + len(data)
	msg := make([]byte, 16+4+align4(alen))
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], nfnlSubsysULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg[16] = unix.AF_UNSPEC
	binary.BigEndian.PutUint16(msg[18:], c.group)
	binary.NativeEndian.PutUint16(msg[20:], uint16(alen))
	binary.NativeEndian.PutUint16(msg[22:], attrType)
	copy(msg[24:], data)
	if _, err := c.f.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.f.Read(buf)
		if err != nil {
			return err
		}
		for b := buf[:n]; len(b) >= 16; {
			l := int(binary.NativeEndian.Uint32(b[0:]))
			typ := binary.NativeEndian.Uint16(b[4:])
			if l < 16 || l > len(b) {
				return errors.New("short netlink message")
			}
			if typ == unix.NLMSG_ERROR && l >= 20 {
				if e := int32(binary.NativeEndian.Uint32(b[16:])); e != 0 {
					return unix.Errno(-e)
				}
				return nil
			}
			b = b[align4(l):]
		}
	}
}

func align4(n int) int { return (n + 3) &^ 3 }

// Close releases the socket; a blocked read returns.
func (c *nflogConn) Close() error { return c.f.Close() }

// read blocks for the next batch of logged packets. prefix is the rule
// prefix's leading word (ours); packets with other prefixes are ignored.
func (c *nflogConn) read(buf []byte, prefix string) ([]Match, error) {
	n, err := c.f.Read(buf)
	if err != nil {
		if errors.Is(err, unix.ENOBUFS) {
			return nil, nil // dropped under load; counters stay exact
		}
		return nil, err
	}
	var out []Match
	for b := buf[:n]; len(b) >= 16; {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < 16 || l > len(b) {
			break
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		if typ == nfnlSubsysULOG<<8|nfulnlMsgPacket && l >= 20 {
			if m, ok := parseNFLOGPacket(b[16:l], prefix); ok {
				out = append(out, m)
			}
		}
		b = b[min(align4(l), len(b)):]
	}
	return out, nil
}

func parseNFLOGPacket(msg []byte, prefix string) (Match, bool) {
	fam := msg[0]
	var payload []byte
	var pfx string
	for a := msg[4:]; len(a) >= 4; {
		alen := int(binary.NativeEndian.Uint16(a[0:]))
		atype := binary.NativeEndian.Uint16(a[2:]) & 0x3fff
		if alen < 4 || alen > len(a) {
			break
		}
		data := a[4:alen]
		switch atype {
		case nfulaPayload:
			payload = data
		case nfulaPrefix:
			pfx = strings.TrimRight(string(data), "\x00")
		}
		a = a[min(align4(alen), len(a)):]
	}
	word, class, ok := strings.Cut(pfx, " ")
	if !ok || word != prefix {
		return Match{}, false
	}
	m := Match{Class: class}
	if !parseIPHeader(fam, payload, &m) {
		return Match{}, false
	}
	return m, true
}

func parseIPHeader(fam byte, p []byte, m *Match) bool {
	var proto byte
	var l4 []byte
	switch fam {
	case unix.AF_INET:
		if len(p) < 20 {
			return false
		}
		ihl := int(p[0]&0x0f) * 4
		if ihl < 20 || len(p) < ihl {
			return false
		}
		proto = p[9]
		m.Src, _ = netip.AddrFromSlice(p[12:16])
		m.Dst, _ = netip.AddrFromSlice(p[16:20])
		l4 = p[ihl:]
	case unix.AF_INET6:
		if len(p) < 40 {
			return false
		}
		proto = p[6]
		m.Src, _ = netip.AddrFromSlice(p[8:24])
		m.Dst, _ = netip.AddrFromSlice(p[24:40])
		l4 = p[40:]
	default:
		return false
	}
	switch proto {
	case unix.IPPROTO_TCP:
		m.Proto = "tcp"
	case unix.IPPROTO_UDP:
		m.Proto = "udp"
	case unix.IPPROTO_ICMP:
		m.Proto = "icmp"
	case unix.IPPROTO_ICMPV6:
		m.Proto = "icmpv6"
	default:
		m.Proto = fmt.Sprint(proto)
	}
	if (m.Proto == "tcp" || m.Proto == "udp") && len(l4) >= 4 {
		m.DstPort = binary.BigEndian.Uint16(l4[2:4])
	}
	return true
}
