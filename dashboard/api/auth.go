package api

import (
	"net/http"
	"net/mail"
	"strings"
	"time"
)

// sessionResponse is GET /api/session.
type sessionResponse struct {
	SignedIn     bool       `json:"signedIn"`
	Email        string     `json:"email,omitempty"`
	Role         Role       `json:"role,omitempty"`
	Via          string     `json:"via,omitempty"`
	ExpiresAt    *time.Time `json:"expiresAt,omitempty"`
	CSRFToken    string     `json:"csrfToken"`
	DevSignIn    bool       `json:"devSignIn"`
	GoogleSignIn bool       `json:"googleSignIn"`
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, c caller) {
	resp := sessionResponse{DevSignIn: s.cfg.DevSignIn, GoogleSignIn: s.cfg.GoogleSignIn()}
	if c.sess != nil {
		exp := time.Unix(c.sess.ExpiresAt, 0).UTC()
		resp.SignedIn, resp.Email, resp.Role, resp.Via, resp.ExpiresAt, resp.CSRFToken = true, c.sess.Email, c.role, c.sess.Via, &exp, c.sess.CSRF
	} else {
		if _, err := r.Cookie(sessionCookie); err == nil {
			// Expired, tampered, or from a sign-in that is now off.
			http.SetCookie(w, s.cookie(sessionCookie, "", "/", 0))
		}
		tok, err := s.preSessionCSRF(w, r)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal", "could not make a CSRF token")
			return
		}
		resp.CSRFToken = tok
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) devSignIn(w http.ResponseWriter, r *http.Request, _ caller) {
	if !s.cfg.DevSignIn {
		writeError(w, http.StatusNotFound, "not_found", "development sign-in is off (LEVERS9_DASHBOARD_DEV_SIGNIN=true turns it on, never in production)")
		return
	}
	var body struct {
		Email string `json:"email"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	addr, err := mail.ParseAddress(strings.TrimSpace(body.Email))
	if err != nil || addr.Name != "" || !strings.Contains(addr.Address, "@") {
		writeError(w, http.StatusBadRequest, "invalid_argument", "email: not an email address")
		return
	}
	email := strings.ToLower(addr.Address)
	sess, err := s.startSession(w, email, viaDev)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "could not sign in")
		return
	}
	s.metrics.signins.WithLabelValues(viaDev, "ok").Inc()
	s.log.Warn("development sign-in used", "email", email, "role", s.roleOf(email))
	exp := time.Unix(sess.ExpiresAt, 0).UTC()
	writeJSON(w, http.StatusOK, sessionResponse{SignedIn: true, Email: email, Role: s.roleOf(email), Via: viaDev, ExpiresAt: &exp,
		CSRFToken: sess.CSRF, DevSignIn: true, GoogleSignIn: s.cfg.GoogleSignIn()})
}

func (s *Server) signOut(w http.ResponseWriter, _ *http.Request, _ caller) {
	http.SetCookie(w, s.cookie(sessionCookie, "", "/", 0))
	w.WriteHeader(http.StatusNoContent)
}
