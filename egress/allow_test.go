package egress

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAllow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want string // AllowEntry.String(), or the reason when wantErr
		err  bool
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3", want: "10.1.2.3/32"},
		{in: "10.0.0.0/8:443", want: "10.0.0.0/8:443"},
		{in: "10.0.0.0/8:53/udp", want: "10.0.0.0/8:53/udp"},
		{in: "192.168.1.7:8080/tcp", want: "192.168.1.7/32:8080/tcp"},
		{in: "fd00::/8", want: "fd00::/8"},
		{in: "fd00::1", want: "fd00::1/128"},
		{in: "[fd00::/8]:443", want: "[fd00::/8]:443"},
		{in: "[2001:db8::10]:53/udp", want: "[2001:db8::10/128]:53/udp"},
		{in: "[2001:db8::/32]", want: "2001:db8::/32"},
		{in: "10.0.0.0/33", err: true, want: "prefix length out of range"},
		{in: "10.0.0.1/8", err: true, want: "host bits set (did you mean 10.0.0.0/8?)"},
		{in: "10.0.0.0/8:0", err: true, want: `port "0" is not a number between 1 and 65535`},
		{in: "10.0.0.0/8:70000", err: true, want: `port "70000" is not a number between 1 and 65535`},
		{in: "10.0.0.0/8:", err: true, want: "empty port"},
		{in: "10.0.0.0/8:80/icmp", err: true, want: `protocol "icmp" is not tcp or udp`},
		{in: "10.0.0.0/8/tcp", err: true, want: "a protocol needs a port (CIDR:port/proto)"},
		{in: "example.com", err: true, want: `"example.com" is not an IP address`},
		{in: "", err: true, want: "empty entry"},
		{in: " 10.0.0.0/8", err: true, want: "leading or trailing space"},
		{in: "[fd00::1", err: true, want: "missing ']' after IPv6 address"},
		{in: "[10.0.0.1]:80", err: true, want: "brackets are only for IPv6 addresses"},
		{in: "[fd00::1]80", err: true, want: "expected ':port' after ']'"},
		{in: "fe80::1%eth0", err: true, want: "zoned addresses are not allowed"},
		{in: "::ffff:10.0.0.1", err: true, want: "IPv4-mapped IPv6 addresses are not allowed; write the IPv4 address"},
		{in: "fd00::/129", err: true, want: "prefix length out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAllow("egress.allow", []string{tc.in})
			if tc.err {
				var ee *EntryError
				if !errors.As(err, &ee) {
					t.Fatalf("ParseAllow(%q) err = %v, want *EntryError", tc.in, err)
				}
				if ee.Reason != tc.want || ee.Index != 0 || ee.Entry != tc.in {
					t.Fatalf("ParseAllow(%q) = %+v, want reason %q", tc.in, ee, tc.want)
				}
				return
			}
			if err != nil || len(got) != 1 || got[0].String() != tc.want {
				t.Fatalf("ParseAllow(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseAllowReportsAllAtOnce(t *testing.T) {
	t.Parallel()
	_, err := ParseAllow("egress.allow", []string{"10.0.0.0/8", "bad", "10.0.0.0/33", "[fd00::1]:99999"})
	if err == nil {
		t.Fatal("want error")
	}
	msg := err.Error()
	for _, want := range []string{
		`egress.allow[1]: "bad": "bad" is not an IP address`,
		`egress.allow[2]: "10.0.0.0/33": prefix length out of range`,
		`egress.allow[3]: "[fd00::1]:99999": port "99999" is not a number between 1 and 65535`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "allow[0]") {
		t.Errorf("good entry reported: %q", msg)
	}
}

func FuzzParseAllow(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "10.0.0.1:443/tcp", "[fd00::/8]:53/udp", "fd00::1", "1.2.3.4/33", "[::1]:", "", "[", "0.0.0.0/0:65535/udp"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseAllow("egress.allow", []string{s})
		if err != nil {
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Reason == "" {
				t.Fatalf("ParseAllow(%q): error without reason: %v", s, err)
			}
			return
		}
		e := got[0]
		if !e.Prefix.IsValid() || e.Prefix.Masked() != e.Prefix {
			t.Fatalf("ParseAllow(%q) = invalid or unmasked prefix %v", s, e.Prefix)
		}
		if e.Proto != "" && e.Port == 0 {
			t.Fatalf("ParseAllow(%q): proto without port", s)
		}
		// The canonical rendering parses back to the same entry.
		again, err := ParseAllow("egress.allow", []string{e.String()})
		if err != nil || again[0] != e {
			t.Fatalf("round trip %q -> %q -> %v, %v", s, e.String(), again, err)
		}
	})
}
