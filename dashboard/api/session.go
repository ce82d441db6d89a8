package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Cookie names. The session and the pre-sign-in CSRF cookie are HttpOnly:
// the browser app learns the CSRF token from GET /api/session instead.
const (
	sessionCookie = "levers9_session"
	csrfCookie    = "levers9_csrf"
	oidcCookie    = "levers9_oidc"
	// CSRFHeader carries the CSRF token on every state-changing request.
	CSRFHeader = "X-CSRF-Token"
)

// Role is what a signed-in user may do.
type Role string

// The roles; see API.md for which routes each may use.
const (
	RoleAdmin  Role = "admin"
	RoleMember Role = "member"
)

// Sign-in methods, recorded in the session.
const (
	viaGoogle = "google"
	viaDev    = "dev"
)

// session is the signed content of the session cookie.
type session struct {
	Email string `json:"e"`
	Via   string `json:"v"`
	// CSRF is the token state-changing requests must echo in CSRFHeader.
	CSRF      string `json:"c"`
	IssuedAt  int64  `json:"i"`
	ExpiresAt int64  `json:"x"`
}

// signer makes and checks signed cookie values. Each purpose has its own
// key derived from the session secret, so a value signed for one cookie is
// never accepted as another.
type signer struct {
	keys map[string][]byte
}

func newSigner(secret string) *signer {
	s := &signer{keys: map[string][]byte{}}
	for _, purpose := range []string{sessionCookie, csrfCookie, oidcCookie} {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte("levers9-dashboard-cookie/v1/" + purpose))
		s.keys[purpose] = m.Sum(nil)
	}
	return s
}

var errBadCookie = errors.New("cookie is not valid")

// sign returns base64url(json(v)) "." base64url(mac).
func (s *signer) sign(purpose string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s cookie: %w", purpose, err)
	}
	body := base64.RawURLEncoding.EncodeToString(b)
	return body + "." + base64.RawURLEncoding.EncodeToString(s.mac(purpose, body)), nil
}

func (s *signer) mac(purpose, body string) []byte {
	m := hmac.New(sha256.New, s.keys[purpose])
	m.Write([]byte(body))
	return m.Sum(nil)
}

// open checks the signature and decodes into v.
func (s *signer) open(purpose, value string, v any) error {
	body, sig, ok := strings.Cut(value, ".")
	if !ok {
		return errBadCookie
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(purpose, body)) {
		return errBadCookie
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return errBadCookie
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errBadCookie
	}
	return nil
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func equalSecret(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// cookie builds a cookie with the attributes every cookie of the API has.
func (s *Server) cookie(name, value, path string, maxAge time.Duration) *http.Cookie {
	c := &http.Cookie{Name: name, Value: value, Path: path, Domain: s.cfg.CookieDomain,
		HttpOnly: true, Secure: s.cfg.secureCookies(), SameSite: http.SameSiteLaxMode}
	if maxAge > 0 {
		c.MaxAge = int(maxAge / time.Second)
		c.Expires = s.clock.Now().Add(maxAge)
	} else {
		c.MaxAge = -1
	}
	return c
}

// startSession signs email in and sets the session cookie.
func (s *Server) startSession(w http.ResponseWriter, email, via string) (*session, error) {
	now := s.clock.Now()
	sess := &session{Email: email, Via: via, CSRF: randomToken(), IssuedAt: now.Unix(), ExpiresAt: now.Add(s.cfg.SessionTTL).Unix()}
	v, err := s.signer.sign(sessionCookie, sess)
	if err != nil {
		return nil, err
	}
	http.SetCookie(w, s.cookie(sessionCookie, v, "/", s.cfg.SessionTTL))
	http.SetCookie(w, s.cookie(csrfCookie, "", "/", 0))
	return sess, nil
}

// sessionOf returns the request's valid session, or nil. A session is
// invalid when its signature is wrong, it has expired, it came from the
// development sign-in while that is off, or its email is no longer
// allowed.
func (s *Server) sessionOf(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	var sess session
	if s.signer.open(sessionCookie, c.Value, &sess) != nil {
		return nil
	}
	if s.clock.Now().Unix() >= sess.ExpiresAt || sess.Email == "" || sess.CSRF == "" {
		return nil
	}
	switch sess.Via {
	case viaDev:
		if !s.cfg.DevSignIn {
			return nil
		}
	case viaGoogle:
		if !s.cfg.GoogleSignIn() || !s.domainAllowed(sess.Email) {
			return nil
		}
	default:
		return nil
	}
	return &sess
}

// roleOf maps an email to its role: admins by LEVERS9_DASHBOARD_ADMINS
// (exact email or @domain), everyone else a member.
func (s *Server) roleOf(email string) Role {
	email = strings.ToLower(email)
	_, domain, _ := strings.Cut(email, "@")
	if slices.Contains(s.cfg.Admins, email) || slices.Contains(s.cfg.Admins, "@"+domain) {
		return RoleAdmin
	}
	return RoleMember
}

func (s *Server) domainAllowed(email string) bool {
	_, domain, ok := strings.Cut(strings.ToLower(email), "@")
	return ok && slices.Contains(s.cfg.AllowedDomains, domain)
}

// preSessionCSRF returns the CSRF token of a visitor who is not signed in,
// from its signed cookie, making and setting one when there is none.
func (s *Server) preSessionCSRF(w http.ResponseWriter, r *http.Request) (string, error) {
	if c, err := r.Cookie(csrfCookie); err == nil {
		var tok string
		if s.signer.open(csrfCookie, c.Value, &tok) == nil && tok != "" {
			return tok, nil
		}
	}
	tok := randomToken()
	v, err := s.signer.sign(csrfCookie, tok)
	if err != nil {
		return "", err
	}
	http.SetCookie(w, s.cookie(csrfCookie, v, "/", 24*time.Hour))
	return tok, nil
}

// csrfOK checks a state-changing request: its Origin, when present, must be
// the web app's or the API's own, and CSRFHeader must equal the session's
// token (or, before sign-in, the pre-session cookie's).
func (s *Server) csrfOK(r *http.Request, sess *session) bool {
	if o := r.Header.Get("Origin"); o != "" && o != s.cfg.webOrigin() && o != s.cfg.publicOrigin() {
		return false
	}
	got := r.Header.Get(CSRFHeader)
	if sess != nil {
		return equalSecret(got, sess.CSRF)
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	var tok string
	if s.signer.open(csrfCookie, c.Value, &tok) != nil {
		return false
	}
	return equalSecret(got, tok)
}
