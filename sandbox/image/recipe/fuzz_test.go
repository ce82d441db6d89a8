package recipe

import (
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics, and a recipe that parses and validates
// survives Marshal and Parse unchanged, with an unchanged Hash.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		goodYAML,
		"base: x\n",
		`{"base":"x","steps":[{"copy":{"src":"a","dst":"/b","blob":"sha256:` + "0000000000000000000000000000000000000000000000000000000000000000" + `"}}]}`,
		"base: x\nsteps:\n  - run: \"a\\u0085b\\x7f\"\n  - env: {A: \"\\t\", B: ~}\n",
		"base: x\nsteps:\n  - run: !!binary aGVsbG8=\n",
		"base: x\nentrypoint: [\"\"]\ncmd: []\n",
		"base: &a x\n",
		"- 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse(data)
		if err != nil {
			return
		}
		if r.Validate() != nil {
			return
		}
		b, err := Marshal(r)
		if err != nil {
			t.Fatalf("Marshal of a valid recipe: %v", err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("Parse(Marshal(r)) of %q: %v\nmarshaled: %s", data, err, b)
		}
		if !reflect.DeepEqual(r, back) {
			t.Fatalf("round trip of %q:\n got %#v\nwant %#v\nmarshaled: %s", data, back, r, b)
		}
		if b2, _ := Marshal(back); string(b2) != string(b) {
			t.Fatalf("Marshal not stable: %s / %s", b, b2)
		}
		filled := r.Clone()
		for i := range filled.Steps {
			if c := filled.Steps[i].Copy; c != nil && c.Blob == "" {
				c.Blob = "sha256:" + "1111111111111111111111111111111111111111111111111111111111111111"
			}
		}
		h1, err := Hash(filled, "sha256:"+"2222222222222222222222222222222222222222222222222222222222222222")
		if err != nil {
			t.Fatalf("Hash of a valid recipe: %v", err)
		}
		fb, _ := Marshal(filled)
		fr, err := Parse(fb)
		if err != nil {
			t.Fatal(err)
		}
		if h2, _ := Hash(fr, "sha256:"+"2222222222222222222222222222222222222222222222222222222222222222"); h1 != h2 {
			t.Fatalf("Hash changed across Marshal/Parse: %s %s", h1, h2)
		}
	})
}
