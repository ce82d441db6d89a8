package api

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// GoogleIssuer is the OpenID provider used unless
// LEVERS9_DASHBOARD_OIDC_ISSUER names another (tests run their own).
const GoogleIssuer = "https://accounts.google.com"

// Config is everything the API reads from its environment. Secrets may be
// given as NAME or as NAME_FILE (a file holding the value), so a deployment
// can keep them out of the process environment too.
type Config struct {
	// Addr is where the API listens (LEVERS9_DASHBOARD_ADDR, default
	// 127.0.0.1:1997).
	Addr string
	// PublicURL is the API's own base URL as browsers reach it
	// (LEVERS9_DASHBOARD_PUBLIC_URL, default http://ADDR): the OIDC
	// redirect URI is PublicURL + /api/auth/google/callback, and cookies are
	// Secure unless its host is localhost or a loopback address.
	PublicURL string
	// WebURL is the web app's base URL (LEVERS9_DASHBOARD_WEB_URL, default
	// PublicURL): sign-in ends there, and it is the one cross-origin caller
	// allowed (CORS, WebSocket Origin).
	WebURL string

	// Controlplane is the controlplane's gRPC address
	// (LEVERS9_DASHBOARD_CONTROLPLANE); TLS follows the CLI's rule (port 443,
	// LEVERS9_DASHBOARD_CONTROLPLANE_TLS=true or LEVERS9_CONTROLPLANE_TLS=true).
	Controlplane string
	// ControlplaneTLS and ControlplaneCA: LEVERS9_DASHBOARD_CONTROLPLANE_TLS,
	// LEVERS9_DASHBOARD_CONTROLPLANE_CA.
	ControlplaneTLS bool
	ControlplaneCA  string
	// Token is a workspace admin token (LEVERS9_DASHBOARD_TOKEN[_FILE]).
	Token string

	// GoogleClientID and GoogleClientSecret turn Google sign-in on
	// (LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID, ..._GOOGLE_CLIENT_SECRET[_FILE]).
	GoogleClientID     string
	GoogleClientSecret string
	// OIDCIssuer is the OpenID provider (LEVERS9_DASHBOARD_OIDC_ISSUER,
	// default Google).
	OIDCIssuer string
	// AllowedDomains are the email domains that may sign in with Google
	// (LEVERS9_DASHBOARD_ALLOWED_DOMAINS, comma separated, lower case).
	AllowedDomains []string
	// Admins are emails or "@domain"s whose users are admins
	// (LEVERS9_DASHBOARD_ADMINS, comma separated); every other signed-in
	// user is a member.
	Admins []string
	// DevSignIn accepts any email without a password
	// (LEVERS9_DASHBOARD_DEV_SIGNIN=true). Never in production.
	DevSignIn bool

	// SessionSecret signs cookies (LEVERS9_DASHBOARD_SESSION_SECRET[_FILE],
	// at least 32 characters).
	SessionSecret string
	// SessionTTL is how long a sign-in lasts (LEVERS9_DASHBOARD_SESSION_TTL,
	// default 12h).
	SessionTTL time.Duration
	// CookieDomain is the session cookie's Domain attribute
	// (LEVERS9_DASHBOARD_COOKIE_DOMAIN; empty: host-only).
	CookieDomain string

	// MetricsToken, when set, is required as "Authorization: Bearer TOKEN"
	// on /metrics (LEVERS9_DASHBOARD_METRICS_TOKEN[_FILE]).
	MetricsToken string
	// PollInterval is how often the machine and task-list views ask the
	// controlplane for changes (LEVERS9_DASHBOARD_POLL_INTERVAL, default 1s).
	PollInterval time.Duration
}

// ConfigFromEnv reads the config through getenv, reporting every problem
// at once, each naming its variable.
func ConfigFromEnv(getenv func(string) string) (*Config, error) {
	var errs []error
	secret := func(name string) string {
		v := getenv(name)
		f := getenv(name + "_FILE")
		if v != "" && f != "" {
			errs = append(errs, fmt.Errorf("%s and %s_FILE are both set: use one", name, name))
			return v
		}
		if f == "" {
			return v
		}
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s_FILE: read %s: %w", name, f, err))
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	boolean := func(name string) bool {
		v := getenv(name)
		if v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not true or false", name, v))
		}
		return b
	}
	duration := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q is not a positive duration like 12h", name, v))
			return def
		}
		return d
	}
	c := &Config{
		Addr:               getenv("LEVERS9_DASHBOARD_ADDR"),
		PublicURL:          getenv("LEVERS9_DASHBOARD_PUBLIC_URL"),
		WebURL:             getenv("LEVERS9_DASHBOARD_WEB_URL"),
		Controlplane:       getenv("LEVERS9_DASHBOARD_CONTROLPLANE"),
		ControlplaneTLS:    boolean("LEVERS9_DASHBOARD_CONTROLPLANE_TLS"),
		ControlplaneCA:     getenv("LEVERS9_DASHBOARD_CONTROLPLANE_CA"),
		Token:              secret("LEVERS9_DASHBOARD_TOKEN"),
		GoogleClientID:     getenv("LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID"),
		GoogleClientSecret: secret("LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET"),
		OIDCIssuer:         getenv("LEVERS9_DASHBOARD_OIDC_ISSUER"),
		AllowedDomains:     list(getenv("LEVERS9_DASHBOARD_ALLOWED_DOMAINS")),
		Admins:             list(getenv("LEVERS9_DASHBOARD_ADMINS")),
		DevSignIn:          boolean("LEVERS9_DASHBOARD_DEV_SIGNIN"),
		SessionSecret:      secret("LEVERS9_DASHBOARD_SESSION_SECRET"),
		SessionTTL:         duration("LEVERS9_DASHBOARD_SESSION_TTL", 0),
		CookieDomain:       getenv("LEVERS9_DASHBOARD_COOKIE_DOMAIN"),
		MetricsToken:       secret("LEVERS9_DASHBOARD_METRICS_TOKEN"),
		PollInterval:       duration("LEVERS9_DASHBOARD_POLL_INTERVAL", 0),
	}
	c.WithDefaults()
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.ToLower(strings.TrimSpace(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// WithDefaults fills what was left empty.
func (c *Config) WithDefaults() {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:1997"
	}
	if c.PublicURL == "" {
		c.PublicURL = "http://" + c.Addr
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	if c.WebURL == "" {
		c.WebURL = c.PublicURL
	}
	c.WebURL = strings.TrimRight(c.WebURL, "/")
	if c.OIDCIssuer == "" {
		c.OIDCIssuer = GoogleIssuer
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 12 * time.Hour
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
}

// Validate reports every problem at once, each naming its variable.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Controlplane == "" {
		bad("LEVERS9_DASHBOARD_CONTROLPLANE is not set: the controlplane's gRPC HOST:PORT")
	} else if _, _, err := net.SplitHostPort(c.Controlplane); err != nil {
		bad("LEVERS9_DASHBOARD_CONTROLPLANE=%q is not HOST:PORT", c.Controlplane)
	}
	if c.Token == "" {
		bad("LEVERS9_DASHBOARD_TOKEN (or _FILE) is not set: a workspace admin token (levers9 token create --role admin)")
	}
	if len(c.SessionSecret) < 32 {
		bad("LEVERS9_DASHBOARD_SESSION_SECRET (or _FILE) must be at least 32 characters (openssl rand -hex 32)")
	}
	for name, u := range map[string]string{"LEVERS9_DASHBOARD_PUBLIC_URL": c.PublicURL, "LEVERS9_DASHBOARD_WEB_URL": c.WebURL} {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || (p.Path != "" && p.Path != "/") {
			bad("%s=%q is not an http(s)://HOST[:PORT] base URL", name, u)
		}
	}
	google := c.GoogleClientID != "" || c.GoogleClientSecret != ""
	if google {
		if c.GoogleClientID == "" || c.GoogleClientSecret == "" {
			bad("LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID and LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET must be set together")
		}
		if len(c.AllowedDomains) == 0 {
			bad("LEVERS9_DASHBOARD_ALLOWED_DOMAINS is empty: name the email domains that may sign in with Google (example.com,example.org)")
		}
		if p, err := url.Parse(c.OIDCIssuer); err != nil || (p.Scheme != "https" && !isLoopbackHost(p.Hostname())) {
			bad("LEVERS9_DASHBOARD_OIDC_ISSUER=%q must be an https URL (http only on a loopback address, for tests)", c.OIDCIssuer)
		}
	}
	for i, d := range c.AllowedDomains {
		if strings.Contains(d, "@") || !strings.Contains(d, ".") && d != "localhost" {
			bad("LEVERS9_DASHBOARD_ALLOWED_DOMAINS[%d]=%q is not a domain like example.com", i, d)
		}
	}
	for i, a := range c.Admins {
		if !strings.Contains(a, "@") {
			bad("LEVERS9_DASHBOARD_ADMINS[%d]=%q is neither an email nor an @domain", i, a)
		}
	}
	if !google && !c.DevSignIn {
		bad("no sign-in is configured: set LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID and _SECRET, or LEVERS9_DASHBOARD_DEV_SIGNIN=true for development")
	}
	return errors.Join(errs...)
}

// GoogleSignIn reports whether OIDC sign-in is configured.
func (c *Config) GoogleSignIn() bool { return c.GoogleClientID != "" }

// secureCookies is false only when browsers reach the API on a loopback
// host over plain HTTP, where a Secure cookie would never be sent back.
func (c *Config) secureCookies() bool {
	p, err := url.Parse(c.PublicURL)
	if err != nil {
		return true
	}
	return p.Scheme == "https" || !isLoopbackHost(p.Hostname())
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// webOrigin is WebURL as an Origin header carries it.
func (c *Config) webOrigin() string {
	p, err := url.Parse(c.WebURL)
	if err != nil {
		return ""
	}
	return p.Scheme + "://" + p.Host
}

// publicOrigin is PublicURL as an Origin header carries it.
func (c *Config) publicOrigin() string {
	p, err := url.Parse(c.PublicURL)
	if err != nil {
		return ""
	}
	return p.Scheme + "://" + p.Host
}
