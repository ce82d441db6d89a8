package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// oidcFlowTTL bounds the time between leaving for the provider and coming
// back: the flow cookie (state, nonce, PKCE verifier) expires after it.
const oidcFlowTTL = 10 * time.Minute

// oidcClient is the relying party: the provider is discovered on first use
// and kept once discovery succeeded.
type oidcClient struct {
	cfg *Config

	// mu guards provider.
	mu       sync.Mutex
	provider *oidc.Provider
}

func newOIDCClient(cfg *Config) *oidcClient { return &oidcClient{cfg: cfg} }

func (o *oidcClient) get(ctx context.Context) (*oidc.Provider, *oauth2.Config, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider == nil {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, err := oidc.NewProvider(ctx, o.cfg.OIDCIssuer)
		if err != nil {
			return nil, nil, fmt.Errorf("discover the OpenID provider %s: %w", o.cfg.OIDCIssuer, err)
		}
		o.provider = p
	}
	oc := &oauth2.Config{ClientID: o.cfg.GoogleClientID, ClientSecret: o.cfg.GoogleClientSecret, Endpoint: o.provider.Endpoint(),
		RedirectURL: o.cfg.PublicURL + "/api/auth/google/callback", Scopes: []string{oidc.ScopeOpenID, "email", "profile"}}
	return o.provider, oc, nil
}

// oidcFlow is the signed content of the flow cookie.
type oidcFlow struct {
	State     string `json:"s"`
	Nonce     string `json:"n"`
	Verifier  string `json:"v"`
	Next      string `json:"r"`
	ExpiresAt int64  `json:"x"`
}

// safeNext keeps a post-sign-in path inside the web app: a path, never a
// URL or a scheme-relative "//host".
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
}

// signinFailed sends the browser back to the web app's sign-in page with a
// short reason code (API.md lists them).
func (s *Server) signinFailed(w http.ResponseWriter, r *http.Request, code string) {
	s.metrics.signins.WithLabelValues(viaGoogle, "refused").Inc()
	http.SetCookie(w, s.cookie(oidcCookie, "", "/api/auth/google", 0))
	http.Redirect(w, r, s.cfg.WebURL+"/signin?error="+url.QueryEscape(code), http.StatusSeeOther)
}

func (s *Server) googleStart(w http.ResponseWriter, r *http.Request, _ caller) {
	if s.oidc == nil {
		writeError(w, http.StatusNotFound, "not_found", "Google sign-in is not configured on this API")
		return
	}
	_, oc, err := s.oidc.get(r.Context())
	if err != nil {
		s.log.Error("Google sign-in unavailable", "err", err)
		s.metrics.signins.WithLabelValues(viaGoogle, "error").Inc()
		writeError(w, http.StatusBadGateway, "unavailable", "the sign-in provider cannot be reached; try again")
		return
	}
	flow := oidcFlow{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier(),
		Next: safeNext(r.URL.Query().Get("next")), ExpiresAt: s.clock.Now().Add(oidcFlowTTL).Unix()}
	v, err := s.signer.sign(oidcCookie, flow)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "could not start sign-in")
		return
	}
	http.SetCookie(w, s.cookie(oidcCookie, v, "/api/auth/google", oidcFlowTTL))
	http.Redirect(w, r, oc.AuthCodeURL(flow.State, oidc.Nonce(flow.Nonce), oauth2.S256ChallengeOption(flow.Verifier)), http.StatusFound)
}

func (s *Server) googleCallback(w http.ResponseWriter, r *http.Request, _ caller) {
	if s.oidc == nil {
		writeError(w, http.StatusNotFound, "not_found", "Google sign-in is not configured on this API")
		return
	}
	q := r.URL.Query()
	c, err := r.Cookie(oidcCookie)
	var flow oidcFlow
	if err != nil || s.signer.open(oidcCookie, c.Value, &flow) != nil {
		s.signinFailed(w, r, "no_flow")
		return
	}
	if s.clock.Now().Unix() >= flow.ExpiresAt {
		s.signinFailed(w, r, "flow_expired")
		return
	}
	if !equalSecret(q.Get("state"), flow.State) {
		s.signinFailed(w, r, "state_mismatch")
		return
	}
	if e := q.Get("error"); e != "" {
		s.signinFailed(w, r, "provider_refused")
		return
	}
	provider, oc, err := s.oidc.get(r.Context())
	if err != nil {
		s.log.Error("Google sign-in unavailable", "err", err)
		s.signinFailed(w, r, "provider_unavailable")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	tok, err := oc.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(flow.Verifier))
	if err != nil {
		// The error may quote the provider's answer but never our secret.
		s.log.Warn("sign-in code exchange failed", "err", err)
		s.signinFailed(w, r, "exchange_failed")
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := provider.Verifier(&oidc.Config{ClientID: s.cfg.GoogleClientID, Now: s.clock.Now}).Verify(ctx, raw)
	if err != nil {
		s.log.Warn("sign-in ID token refused", "err", err)
		s.signinFailed(w, r, "bad_id_token")
		return
	}
	if !equalSecret(idt.Nonce, flow.Nonce) {
		s.signinFailed(w, r, "nonce_mismatch")
		return
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified any    `json:"email_verified"`
	}
	if err := idt.Claims(&claims); err != nil {
		s.signinFailed(w, r, "bad_id_token")
		return
	}
	verified := claims.EmailVerified == true || claims.EmailVerified == "true"
	if claims.Email == "" {
		// Some providers keep the email for the userinfo endpoint.
		ui, err := provider.UserInfo(ctx, oauth2.StaticTokenSource(tok))
		if err != nil || ui.Subject != idt.Subject {
			s.signinFailed(w, r, "no_email")
			return
		}
		claims.Email, verified = ui.Email, ui.EmailVerified
	}
	email := strings.ToLower(claims.Email)
	switch {
	case email == "":
		s.signinFailed(w, r, "no_email")
		return
	case !verified:
		s.signinFailed(w, r, "email_unverified")
		return
	case !s.domainAllowed(email):
		s.log.Info("sign-in refused: email domain not allowed", "email", email)
		s.signinFailed(w, r, "domain_not_allowed")
		return
	}
	if _, err := s.startSession(w, email, viaGoogle); err != nil {
		s.signinFailed(w, r, "internal")
		return
	}
	http.SetCookie(w, s.cookie(oidcCookie, "", "/api/auth/google", 0))
	s.metrics.signins.WithLabelValues(viaGoogle, "ok").Inc()
	s.log.Info("signed in", "email", email, "via", viaGoogle, "role", s.roleOf(email))
	http.Redirect(w, r, s.cfg.WebURL+flow.Next, http.StatusSeeOther)
}
