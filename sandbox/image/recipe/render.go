package recipe

import (
	"regexp"
	"strings"
)

// The commands apt and pip steps render into; names are appended quoted.
const (
	aptPrefix = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
	aptSuffix = " && rm -rf /var/lib/apt/lists/*"
	pipPrefix = "python3 -m pip install --no-cache-dir"
)

// Rendered returns a deep copy of r's steps, one per step at the same
// index, with apt and pip steps turned into run steps:
//
//	apt: [a, b] -> run: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends a b && rm -rf /var/lib/apt/lists/*
//	pip: [a, b] -> run: python3 -m pip install --no-cache-dir a b
//
// Each name is shell-quoted (Validate already allows only names that need
// no quoting; quoting keeps an unvalidated recipe from injecting commands).
// Rendered expects a valid recipe; a step setting several fields renders
// from its apt list, else its pip list, else is copied as it is.
func (r *Recipe) Rendered() []Step {
	if r == nil || len(r.Steps) == 0 {
		return nil
	}
	out := make([]Step, len(r.Steps))
	for i, s := range r.Steps {
		switch {
		case len(s.Apt) > 0:
			out[i] = Step{Run: aptPrefix + " " + quoteAll(s.Apt) + aptSuffix}
		case len(s.Pip) > 0:
			out[i] = Step{Run: pipPrefix + " " + quoteAll(s.Pip)}
		default:
			out[i] = s.clone()
		}
	}
	return out
}

func quoteAll(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}

var shellSafeRE = regexp.MustCompile(`^[A-Za-z0-9@%+=:,./_-]+$`)

// shellQuote returns s as one word for /bin/sh: unchanged when it has only
// characters the shell gives no meaning to (none at the start of a word
// either: no ~), else in single quotes.
func shellQuote(s string) string {
	if shellSafeRE.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
