package auth

import (
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestMintParse(t *testing.T) {
	t.Parallel()
	id, tok, hash := Mint()
	p, err := ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.ID != id || !HashMatches(hash, p) {
		t.Fatalf("round trip lost id or hash: %s vs %s", p.ID, id)
	}
	_, other, _ := Mint()
	po, _ := ParseToken(other)
	if HashMatches(hash, po) {
		t.Fatal("another token's secret matches")
	}
}

func TestParseTokenRejects(t *testing.T) {
	t.Parallel()
	_, good, _ := Mint()
	parts := strings.Split(good, "_")
	for name, s := range map[string]string{
		"empty":        "",
		"prefix":       "levers8_" + parts[1] + "_" + parts[2],
		"short id":     "levers9_abc_" + parts[2],
		"upper secret": "levers9_" + parts[1] + "_" + strings.ToUpper(parts[2]),
		"extra part":   good + "_x",
		"short secret": "levers9_" + parts[1] + "_" + parts[2][:10],
	} {
		_, err := ParseToken(s)
		if !errdefs.IsUnauthenticated(err) {
			t.Errorf("%s: err = %v, want unauthenticated", name, err)
		}
		if err != nil && s != "" && strings.Contains(err.Error(), parts[2]) {
			t.Errorf("%s: error quotes the secret", name)
		}
	}
}

func TestSecretMatches(t *testing.T) {
	t.Parallel()
	if !SecretMatches("abc", "abc") || SecretMatches("abd", "abc") || SecretMatches("", "") || SecretMatches("abc", "") {
		t.Error("SecretMatches wrong")
	}
}

func FuzzParseToken(f *testing.F) {
	_, good, _ := Mint()
	f.Add(good)
	f.Add("levers9__")
	f.Add("levers9_aaaaaaaaaaaaaaaa_" + strings.Repeat("a", 52))
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseToken(s)
		if err != nil {
			if !errdefs.IsUnauthenticated(err) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if !strings.HasPrefix(p.ID, "tok_") || len(p.ID) != 4+16 || len(p.Hash()) != 32 {
			t.Fatalf("accepted malformed token, id %q", p.ID)
		}
	})
}
