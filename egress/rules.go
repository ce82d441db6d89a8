package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// Class names a kind of destination the egress chains refuse. They appear
// in rule comments, NFLOG prefixes, metrics and the readiness report.
const (
	ClassMetadata  = "metadata"
	ClassNode      = "node"
	ClassContainer = "container"
	ClassPrivate   = "private"
	ClassShared    = "shared"
	ClassLinkLocal = "link-local"
	ClassMulticast = "multicast"
	ClassDNS       = "dns"
)

// Classes lists every class a container's chain can attribute, in rule order.
var Classes = []string{ClassContainer, ClassDNS, ClassMetadata, ClassNode, ClassPrivate, ClassShared, ClassLinkLocal, ClassMulticast}

// MetadataV4 and MetadataV6 are the cloud metadata and platform endpoints
// refused as class "metadata" (checked before the wider ranges that also
// contain some of them, so they are attributed to the right class).
var (
	MetadataV4 = []string{
		"169.254.169.254/32", // AWS, GCP, Azure IMDS, OCI, DigitalOcean, OpenStack, Hetzner
		"169.254.170.2/32",   // AWS ECS task metadata and credentials
		"169.254.170.23/32",  // AWS EKS Pod Identity agent
		"100.100.100.200/32", // Alibaba Cloud
		"168.63.129.16/32",   // Azure WireServer
		"169.254.0.23/32",    // Tencent Cloud
		"192.0.0.192/32",     // Oracle Cloud (legacy)
	}
	MetadataV6 = []string{
		"fd00:ec2::254/128", // AWS IMDS over IPv6
		"fd00:ec2::23/128",  // AWS EKS Pod Identity agent over IPv6
		"fd20:ce::254/128",  // GCP metadata over IPv6
	}
)

type family int

const (
	v4 family = 4
	v6 family = 6
)

func (f family) String() string { return "ipv" + strconv.Itoa(int(f)) }

// chainDef is one chain of ours and its rules (arguments after "-A NAME").
type chainDef struct {
	table string
	name  string
	rules [][]string
}

// hookDef is the jump from a built-in chain into one of ours. It is always
// kept at position 1.
type hookDef struct {
	table   string
	builtin string
	match   []string // before -m comment
	target  string
}

// ruleSet is everything one family installs for one generation.
type ruleSet struct {
	fam    family
	chains []chainDef
	hooks  []hookDef
}

// ctrRules is what the rule builder needs to know of a container.
type ctrRules struct {
	key  string // 8 hex digits, from the container ID
	addr netip.Addr
	pol  policy
	// veth, when set (br_netfilter present), is also matched, so a
	// container cannot pass as another by taking its address.
	veth string
}

type names struct{ prefix string }

// name gives a chain its content-derived name: kind (F, I, N, R or
// c+container key) and a hash of its table and rules, so equal content
// means an equal name and an installed chain is reused as it is.
func (n names) name(c *chainDef, kind string) {
	var b strings.Builder
	b.WriteString(c.table)
	for _, r := range c.rules {
		b.WriteString("\n" + joinArgs(r))
	}
	c.name = n.prefix + "-" + kind + "-" + hashText(b.String())[:6]
}

func (n names) bridge() string             { return n.prefix + "br" }
func (n names) hostVeth(key string) string { return n.prefix + "v" + key[:6] }
func (n names) peerVeth(key string) string { return n.prefix + "p" + key[:6] }
func (n names) netns(key string) string    { return n.prefix + "-" + key }

// buildRules renders the rule set of one family. Containers are sorted by
// key so output is stable; chain names derive from content (see names.name).
func buildRules(p *plan, fam family, ctrs []ctrRules) ruleSet {
	n := names{p.cfg.Prefix}
	br := n.bridge()
	pre := p.cfg.Prefix
	sort.Slice(ctrs, func(i, j int) bool { return ctrs[i].key < ctrs[j].key })

	rejectWith := "icmp-admin-prohibited"
	subnet := p.v4
	if fam == v6 {
		rejectWith = "icmp6-adm-prohibited"
		subnet = p.v6
	}
	// Refusals answer at once (TCP reset, ICMP administratively
	// prohibited) so a refused connection fails fast and counts once.
	rej := chainDef{table: "filter", rules: [][]string{
		{"-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"},
		{"-j", "REJECT", "--reject-with", rejectWith},
	}}
	n.name(&rej, "R")
	reject := []string{"-j", rej.name}
	limit := []string{"-m", "limit", "--limit", strconv.Itoa(p.cfg.LogPerMinute) + "/minute", "--limit-burst", strconv.Itoa(p.cfg.LogBurst)}
	nflog := func(class string) []string {
		return []string{"-j", "NFLOG", "--nflog-group", strconv.Itoa(int(p.cfg.NFLOGGroup)), "--nflog-prefix", pre + " " + class}
	}
	established := []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"}
	inFam := func(a netip.Addr) bool { return a.Is4() == (fam == v4) }
	entries := func(es []AllowEntry) [][]string {
		var out [][]string
		for _, e := range es {
			if !inFam(e.Prefix.Addr()) {
				continue
			}
			d := []string{"-d", e.Prefix.String()}
			switch {
			case e.Port == 0:
				out = append(out, d)
			case e.Proto != "":
				out = append(out, cat(d, []string{"-p", e.Proto, "--dport", strconv.Itoa(int(e.Port))}))
			default:
				for _, proto := range []string{"tcp", "udp"} {
					out = append(out, cat(d, []string{"-p", proto, "--dport", strconv.Itoa(int(e.Port))}))
				}
			}
		}
		return out
	}

	rs := ruleSet{fam: fam}
	var ctrChains []chainDef
	fwd := chainDef{table: "filter"}
	in := chainDef{table: "filter"}
	fwd.rules = append(fwd.rules,
		cat([]string{"-o", br}, established),
		cat([]string{"-i", br}, established))
	in.rules = append(in.rules, cat([]string{"-i", br}, established))
	if fam == v6 {
		// Neighbour discovery comes from link-local or unspecified
		// sources, so it is accepted before dispatch by source.
		for _, t := range []string{"router-solicitation", "neighbour-solicitation", "neighbour-advertisement"} {
			in.rules = append(in.rules, []string{"-i", br, "-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", t, "-m", "hl", "--hl-eq", "255", "-j", "ACCEPT"})
		}
	}
	for _, c := range ctrs {
		if !c.addr.IsValid() || !inFam(c.addr) {
			continue
		}
		cc := buildCtrChain(p, fam, c, reject, limit, nflog, entries, subnet)
		n.name(&cc, "c"+c.key)
		match := []string{"-i", br, "-s", netip.PrefixFrom(c.addr, c.addr.BitLen()).String()}
		if c.veth != "" {
			match = append(match, "-m", "physdev", "--physdev-in", c.veth)
		}
		fwd.rules = append(fwd.rules, cat(match, []string{"-j", cc.name}))
		in.rules = append(in.rules, cat(match, []string{"-j", cc.name}))
		ctrChains = append(ctrChains, cc)
	}
	fwd.rules = append(fwd.rules,
		[]string{"-i", br, "-m", "comment", "--comment", pre + " class=unknown-source", "-j", "DROP"},
		[]string{"-o", br, "-m", "comment", "--comment", pre + " class=inbound", "-j", "DROP"})
	in.rules = append(in.rules, []string{"-i", br, "-m", "comment", "--comment", pre + " class=unknown-source", "-j", "DROP"})
	nat := chainDef{table: "nat", rules: [][]string{
		{"-s", subnet.String(), "!", "-o", br, "-j", "MASQUERADE"},
	}}
	n.name(&fwd, "F")
	n.name(&in, "I")
	n.name(&nat, "N")
	rs.chains = append(rs.chains, fwd, in, rej)
	rs.chains = append(rs.chains, ctrChains...)
	rs.chains = append(rs.chains, nat)
	rs.hooks = []hookDef{
		{table: "filter", builtin: "FORWARD", target: fwd.name},
		{table: "filter", builtin: "INPUT", match: []string{"-i", br}, target: in.name},
		{table: "nat", builtin: "POSTROUTING", target: nat.name},
	}
	return rs
}

func buildCtrChain(p *plan, fam family, ctr ctrRules, reject, limit []string, nflog func(string) []string, entries func([]AllowEntry) [][]string, subnet netip.Prefix) chainDef {
	pre := p.cfg.Prefix
	br := names{pre}.bridge()
	c := chainDef{table: "filter"}
	key := ctr.key
	verdict := []string{"-j", "ACCEPT"}
	if ctr.pol.mode == ModeEnforce {
		verdict = reject
	}
	comment := func(class string) []string {
		return []string{"-m", "comment", "--comment", pre + " ctr=" + key + " class=" + class}
	}
	block := func(match []string, class string, v []string) {
		c.rules = append(c.rules, cat(match, limit, nflog(class)), cat(match, comment(class), v))
	}
	if ctr.pol.isolation {
		// Defence in depth behind port isolation: container to
		// container through the gateway (or bridged with br_netfilter)
		// is refused whatever the egress mode.
		block([]string{"-o", br}, ClassContainer, reject)
	}
	for _, r := range p.resolvers {
		if r.Is4() != (fam == v4) {
			continue
		}
		d := netip.PrefixFrom(r, r.BitLen()).String()
		c.rules = append(c.rules,
			[]string{"-d", d, "-p", "udp", "--dport", "53", "-j", "ACCEPT"},
			[]string{"-d", d, "-p", "tcp", "--dport", "53", "-j", "ACCEPT"})
	}
	block([]string{"-p", "udp", "--dport", "53"}, ClassDNS, verdict)
	block([]string{"-p", "tcp", "--dport", "53"}, ClassDNS, verdict)
	for _, m := range entries(p.controlplane) {
		c.rules = append(c.rules, cat(m, []string{"-j", "ACCEPT"}))
	}
	for _, m := range entries(ctr.pol.allow) {
		c.rules = append(c.rules, cat(m, []string{"-j", "ACCEPT"}))
	}
	meta, private, shared, linkLocal, multicast := MetadataV4, []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}, []string{"100.64.0.0/10"}, []string{"169.254.0.0/16"}, []string{"224.0.0.0/4"}
	if fam == v6 {
		meta, private, shared, linkLocal, multicast = MetadataV6, []string{"fc00::/7"}, nil, []string{"fe80::/10"}, []string{"ff00::/8"}
	}
	for _, d := range meta {
		block([]string{"-d", d}, ClassMetadata, verdict)
	}
	block([]string{"-m", "addrtype", "--dst-type", "LOCAL"}, ClassNode, verdict)
	block([]string{"-d", subnet.String()}, ClassContainer, verdict)
	for _, d := range private {
		block([]string{"-d", d}, ClassPrivate, verdict)
	}
	for _, d := range shared {
		block([]string{"-d", d}, ClassShared, verdict)
	}
	for _, d := range linkLocal {
		block([]string{"-d", d}, ClassLinkLocal, verdict)
	}
	for _, d := range multicast {
		block([]string{"-d", d}, ClassMulticast, verdict)
	}
	c.rules = append(c.rules, []string{"-j", "ACCEPT"})
	return c
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// args are the arguments of the jump rule (after "-A BUILTIN").
func (h hookDef) args(prefix string) []string {
	return cat(h.match, []string{"-m", "comment", "--comment", prefix + " egress", "-j", h.target})
}

// renderSave renders rs in iptables-save syntax (the golden format).
func renderSave(rs ruleSet, prefix string) string {
	var b strings.Builder
	for _, table := range []string{"filter", "nat"} {
		fmt.Fprintf(&b, "*%s\n", table)
		for _, c := range rs.chains {
			if c.table == table {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c.name)
			}
		}
		for _, h := range rs.hooks {
			if h.table == table {
				fmt.Fprintf(&b, "-A %s %s\n", h.builtin, joinArgs(h.args(prefix)))
			}
		}
		for _, c := range rs.chains {
			if c.table != table {
				continue
			}
			for _, r := range c.rules {
				fmt.Fprintf(&b, "-A %s %s\n", c.name, joinArgs(r))
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

func joinArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

func hashText(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:4])
}
