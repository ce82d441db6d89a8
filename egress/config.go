package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
)

// Mode says what a blocked class does.
type Mode string

const (
	// ModeObserve counts and logs what would be refused; traffic goes on.
	ModeObserve Mode = "observe"
	// ModeEnforce counts, logs and rejects.
	ModeEnforce Mode = "enforce"
)

// EgressConfig mirrors worker.containerSecurity.egress.
type EgressConfig struct {
	Mode  Mode     `yaml:"mode" json:"mode"`
	Allow []string `yaml:"allow" json:"allow"`
}

// SecurityConfig mirrors the network half of worker.containerSecurity.
type SecurityConfig struct {
	BridgePortIsolation bool         `yaml:"bridgePortIsolation" json:"bridgePortIsolation"`
	Egress              EgressConfig `yaml:"egress" json:"egress"`
}

// Config configures one node's container network. The zero value plus
// Resolvers and Controlplane is usable after WithDefaults.
type Config struct {
	// Prefix names every host object (1-8 of [a-z0-9]); default "lv9".
	Prefix string
	// Security is worker.containerSecurity's network part.
	Security SecurityConfig
	// SubnetV4 and SubnetV6 are the container subnets; the first host
	// address is the bridge gateway. SubnetV6 should be ULA (fc00::/7).
	SubnetV4 string
	SubnetV6 string
	// Resolvers are the DNS servers containers get in resolv.conf; DNS
	// to anything else is refused (class "dns").
	Resolvers []string
	// Controlplane entries (allow syntax) are always reachable.
	Controlplane []string
	// NodeNetns is the path of the network namespace the bridge and the
	// rules live in; "" means the agent's own (the host's).
	NodeNetns string
	// StateDir holds one directory per container with its resolv.conf.
	StateDir string
	// NFLOGGroup is the netlink log group matches are sent to.
	NFLOGGroup uint16
	// LogPerMinute and LogBurst rate-limit logged matches per rule in
	// the kernel and again per container and class in the agent.
	LogPerMinute int
	LogBurst     int
	// CollectInterval is how often counters are read and hooks checked.
	CollectInterval time.Duration
	// ReportWindow is how far back the readiness report looks.
	ReportWindow time.Duration
}

// Defaults used by WithDefaults.
const (
	DefaultPrefix          = "lv9"
	DefaultSubnetV4        = "10.209.0.0/16"
	DefaultSubnetV6        = "fd6c:7639:9000::/64"
	DefaultStateDir        = "/run/levers9/egress"
	DefaultNFLOGGroup      = 1993
	DefaultLogPerMinute    = 20
	DefaultLogBurst        = 5
	DefaultCollectInterval = 10 * time.Second
	DefaultReportWindow    = 24 * time.Hour
)

// WithDefaults returns a copy with every unset field given its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Security.Egress.Mode == "" {
		c.Security.Egress.Mode = ModeObserve
	}
	if c.SubnetV4 == "" {
		c.SubnetV4 = DefaultSubnetV4
	}
	if c.SubnetV6 == "" {
		c.SubnetV6 = DefaultSubnetV6
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.NFLOGGroup == 0 {
		c.NFLOGGroup = DefaultNFLOGGroup
	}
	if c.LogPerMinute == 0 {
		c.LogPerMinute = DefaultLogPerMinute
	}
	if c.LogBurst == 0 {
		c.LogBurst = DefaultLogBurst
	}
	if c.CollectInterval == 0 {
		c.CollectInterval = DefaultCollectInterval
	}
	if c.ReportWindow == 0 {
		c.ReportWindow = DefaultReportWindow
	}
	return c
}

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// plan is a validated config in parsed form.
type plan struct {
	cfg          Config
	v4, v6       netip.Prefix
	gw4, gw6     netip.Addr
	resolvers    []netip.Addr
	controlplane []AllowEntry
	policy       policy // the node default; containers may override
}

// policy is a parsed SecurityConfig: what one container's chain enforces.
type policy struct {
	mode      Mode
	isolation bool
	allow     []AllowEntry
}

// Validate checks a (per-pool) security override; key names where it came
// from, e.g. "worker.pools.gpu.security".
func (s SecurityConfig) Validate(key string) error {
	_, err := s.parse(key)
	return err
}

func (s SecurityConfig) parse(key string) (policy, error) {
	var errs []error
	switch s.Egress.Mode {
	case ModeObserve, ModeEnforce:
	default:
		errs = append(errs, fmt.Errorf("%s.egress.mode: %q is not observe or enforce", key, s.Egress.Mode))
	}
	allow, err := ParseAllow(key+".egress.allow", s.Egress.Allow)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return policy{}, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	return policy{mode: s.Egress.Mode, isolation: s.BridgePortIsolation, allow: allow}, nil
}

// Validate reports every problem at once, each naming its key.
func (c Config) Validate() error {
	_, err := c.plan()
	return err
}

func (c Config) plan() (*plan, error) {
	p := &plan{cfg: c}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	if !prefixRE.MatchString(c.Prefix) {
		bad("worker.network.prefix", "%q must be 1-8 characters of [a-z0-9] starting with a letter", c.Prefix)
	}
	if pol, err := c.Security.parse("worker.containerSecurity"); err != nil {
		errs = append(errs, err)
	} else {
		p.policy = pol
	}
	if cp, err := ParseAllow("worker.network.controlplane", c.Controlplane); err != nil {
		errs = append(errs, err)
	} else {
		p.controlplane = cp
	}
	var err error
	if p.v4, err = netip.ParsePrefix(c.SubnetV4); err != nil || !p.v4.Addr().Is4() || p.v4.Bits() > 29 || p.v4.Masked() != p.v4 {
		bad("worker.network.subnetV4", "%q is not an IPv4 network of at most /29", c.SubnetV4)
	} else {
		p.gw4 = p.v4.Addr().Next()
	}
	if p.v6, err = netip.ParsePrefix(c.SubnetV6); err != nil || !p.v6.Addr().Is6() || p.v6.Addr().Is4In6() || p.v6.Bits() > 120 || p.v6.Masked() != p.v6 {
		bad("worker.network.subnetV6", "%q is not an IPv6 network of at most /120", c.SubnetV6)
	} else {
		p.gw6 = p.v6.Addr().Next()
	}
	if len(c.Resolvers) == 0 {
		bad("worker.network.resolvers", "at least one resolver is required")
	}
	for i, r := range c.Resolvers {
		a, err := netip.ParseAddr(r)
		if err != nil || a.Zone() != "" {
			bad(fmt.Sprintf("worker.network.resolvers[%d]", i), "%q is not an IP address", r)
			continue
		}
		p.resolvers = append(p.resolvers, a)
	}
	if c.LogPerMinute < 1 || c.LogPerMinute > 10000 {
		bad("worker.network.logPerMinute", "%d is not between 1 and 10000", c.LogPerMinute)
	}
	if c.LogBurst < 1 || c.LogBurst > 10000 {
		bad("worker.network.logBurst", "%d is not between 1 and 10000", c.LogBurst)
	}
	if c.CollectInterval < 100*time.Millisecond {
		bad("worker.network.collectInterval", "%s is shorter than 100ms", c.CollectInterval)
	}
	if c.ReportWindow < time.Minute {
		bad("worker.network.reportWindow", "%s is shorter than a minute", c.ReportWindow)
	}
	if c.StateDir == "" {
		bad("worker.network.stateDir", "must be set")
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("egress config: %w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	return p, nil
}
