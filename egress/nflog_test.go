package egress

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func nfattr(typ uint16, data []byte) []byte {
	b := make([]byte, align4(4+len(data)))
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(data)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], data)
	return b
}

func TestParseNFLOGPacket(t *testing.T) {
	t.Parallel()
	ip4 := make([]byte, 24)
	ip4[0] = 0x45
	ip4[9] = unix.IPPROTO_TCP
	copy(ip4[12:], []byte{10, 209, 0, 2})
	copy(ip4[16:], []byte{169, 254, 169, 254})
	binary.BigEndian.PutUint16(ip4[22:], 80)
	ip6 := make([]byte, 48)
	ip6[0] = 0x60
	ip6[6] = unix.IPPROTO_UDP
	src6, dst6 := netip.MustParseAddr("fd6c::2"), netip.MustParseAddr("2001:db8::53")
	copy(ip6[8:], src6.AsSlice())
	copy(ip6[24:], dst6.AsSlice())
	binary.BigEndian.PutUint16(ip6[42:], 53)
	for _, tc := range []struct {
		name    string
		fam     byte
		prefix  string
		payload []byte
		want    Match
		ok      bool
	}{
		{"v4 tcp", unix.AF_INET, "l9e metadata\x00", ip4, Match{ClassMetadata, netip.MustParseAddr("10.209.0.2"), netip.MustParseAddr("169.254.169.254"), "tcp", 80}, true},
		{"v6 udp", unix.AF_INET6, "l9e dns\x00", ip6, Match{ClassDNS, src6, dst6, "udp", 53}, true},
		{"other prefix", unix.AF_INET, "docker x\x00", ip4, Match{}, false},
		{"short payload", unix.AF_INET, "l9e metadata\x00", ip4[:10], Match{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := append([]byte{tc.fam, 0, 0, 0}, nfattr(nfulaPrefix, []byte(tc.prefix))...)
			msg = append(msg, nfattr(nfulaPayload, tc.payload)...)
			got, ok := parseNFLOGPacket(msg, "l9e")
			if ok != tc.ok || got != tc.want {
				t.Fatalf("got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
			if ok && tc.name == "v4 tcp" && got.Destination() != "169.254.169.254:80/tcp" {
				t.Errorf("destination = %s", got.Destination())
			}
		})
	}
}

func FuzzParseNFLOGPacket(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 8, 0, 10, 0, 'l', '9', 'e', 0})
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) < 4 {
			return
		}
		_, _ = parseNFLOGPacket(msg, "l9e") // must not panic
	})
}
