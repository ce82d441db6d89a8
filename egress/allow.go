package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// AllowEntry is one parsed egress.allow entry: a destination prefix, an
// optional port (0 means every port) and an optional protocol ("" means tcp
// and udp when a port is given, every protocol otherwise).
type AllowEntry struct {
	Prefix netip.Prefix
	Port   uint16
	Proto  string
}

// String renders the entry in the syntax ParseAllow accepts.
func (e AllowEntry) String() string {
	s := e.Prefix.String()
	if e.Port == 0 {
		return s
	}
	if e.Prefix.Addr().Is6() {
		s = "[" + s + "]"
	}
	s += ":" + strconv.Itoa(int(e.Port))
	if e.Proto != "" {
		s += "/" + e.Proto
	}
	return s
}

// EntryError is one refused list entry.
type EntryError struct {
	Key    string // e.g. "egress.allow"
	Index  int
	Entry  string
	Reason string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("%s[%d]: %q: %s", e.Key, e.Index, e.Entry, e.Reason)
}

// ParseAllow parses egress.allow entries: CIDR, CIDR:port, CIDR:port/proto
// (proto tcp or udp), IPv6 as [CIDR]:port[/proto]; a bare address means /32
// or /128. It reports every bad entry at once (errors.Join of *EntryError,
// each naming key, index, entry and reason) and never drops one silently.
func ParseAllow(key string, entries []string) ([]AllowEntry, error) {
	out := make([]AllowEntry, 0, len(entries))
	var errs []error
	for i, raw := range entries {
		e, reason := parseAllowEntry(raw)
		if reason != "" {
			errs = append(errs, &EntryError{Key: key, Index: i, Entry: raw, Reason: reason})
			continue
		}
		out = append(out, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func parseAllowEntry(raw string) (AllowEntry, string) {
	s := raw
	if s == "" {
		return AllowEntry{}, "empty entry"
	}
	if strings.TrimSpace(s) != s {
		return AllowEntry{}, "leading or trailing space"
	}
	var addrPart, portPart string
	hasPort := false
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return AllowEntry{}, "missing ']' after IPv6 address"
		}
		addrPart = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return AllowEntry{}, "expected ':port' after ']'"
			}
			portPart, hasPort = rest[1:], true
		}
		if !strings.Contains(addrPart, ":") {
			return AllowEntry{}, "brackets are only for IPv6 addresses"
		}
	case strings.Count(s, ":") > 1:
		// Bare IPv6 without brackets cannot carry a port: the last
		// group would be ambiguous.
		addrPart = s
		if strings.ContainsAny(s, "[]") {
			return AllowEntry{}, "unbalanced brackets"
		}
	default:
		if i := strings.IndexByte(s, ':'); i >= 0 {
			addrPart, portPart, hasPort = s[:i], s[i+1:], true
		} else {
			addrPart = s
		}
	}
	if !hasPort && strings.Count(addrPart, "/") > 1 {
		return AllowEntry{}, "a protocol needs a port (CIDR:port/proto)"
	}
	prefix, reason := parsePrefix(addrPart)
	if reason != "" {
		return AllowEntry{}, reason
	}
	e := AllowEntry{Prefix: prefix}
	if !hasPort {
		return e, ""
	}
	portStr, proto, hasProto := strings.Cut(portPart, "/")
	if portStr == "" {
		return AllowEntry{}, "empty port"
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 || strings.HasPrefix(portStr, "+") {
		return AllowEntry{}, fmt.Sprintf("port %q is not a number between 1 and 65535", portStr)
	}
	e.Port = uint16(port)
	if hasProto {
		switch proto {
		case "tcp", "udp":
			e.Proto = proto
		default:
			return AllowEntry{}, fmt.Sprintf("protocol %q is not tcp or udp", proto)
		}
	}
	return e, ""
}

func parsePrefix(s string) (netip.Prefix, string) {
	if s == "" {
		return netip.Prefix{}, "empty address"
	}
	addrStr, bitsStr, hasBits := strings.Cut(s, "/")
	addr, err := netip.ParseAddr(addrStr)
	if err != nil {
		return netip.Prefix{}, fmt.Sprintf("%q is not an IP address", addrStr)
	}
	if addr.Zone() != "" {
		return netip.Prefix{}, "zoned addresses are not allowed"
	}
	if addr.Is4In6() {
		return netip.Prefix{}, "IPv4-mapped IPv6 addresses are not allowed; write the IPv4 address"
	}
	if !hasBits {
		return netip.PrefixFrom(addr, addr.BitLen()), ""
	}
	bits, err := strconv.Atoi(bitsStr)
	if err != nil || strings.HasPrefix(bitsStr, "+") || strings.HasPrefix(bitsStr, "-") {
		return netip.Prefix{}, fmt.Sprintf("prefix length %q is not a number", bitsStr)
	}
	if bits < 0 || bits > addr.BitLen() {
		return netip.Prefix{}, "prefix length out of range"
	}
	p := netip.PrefixFrom(addr, bits)
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Sprintf("host bits set (did you mean %s?)", p.Masked())
	}
	return p, ""
}
