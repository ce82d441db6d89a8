package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// validateAllow checks one egress.allow entry: CIDR, CIDR:port,
// CIDR:port/proto, with IPv6 written [CIDR]:port. A bare address is a
// single-host prefix. The agent's egress package applies the entries; this
// check makes a bad entry fail at config load instead.
func validateAllow(entry string) error {
	if entry == "" {
		return errors.New("empty entry")
	}
	host, portProto := entry, ""
	switch {
	case strings.HasPrefix(entry, "["):
		end := strings.Index(entry, "]")
		if end < 0 {
			return errors.New("missing ] after IPv6 prefix")
		}
		host, portProto = entry[1:end], entry[end+1:]
		if portProto != "" {
			if !strings.HasPrefix(portProto, ":") {
				return fmt.Errorf("unexpected %q after ]", portProto)
			}
			portProto = portProto[1:]
			if portProto == "" {
				return errors.New("missing port after ':'")
			}
		}
	case strings.Count(entry, ":") == 1:
		i := strings.Index(entry, ":")
		host, portProto = entry[:i], entry[i+1:]
		if portProto == "" {
			return errors.New("missing port after ':'")
		}
	case strings.Count(entry, ":") > 1:
		// A bare IPv6 prefix with no port.
	}
	if strings.Contains(host, "/") {
		if _, err := netip.ParsePrefix(host); err != nil {
			return fmt.Errorf("bad CIDR: %w", err)
		}
	} else if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("bad address: %w", err)
	}
	if portProto == "" {
		return nil
	}
	port, proto, hasProto := strings.Cut(portProto, "/")
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not 1-65535", port)
	}
	if hasProto && proto != "tcp" && proto != "udp" {
		return fmt.Errorf("protocol %q is not tcp or udp", proto)
	}
	return nil
}
