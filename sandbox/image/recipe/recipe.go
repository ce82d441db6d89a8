package recipe

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// MaxRecipeBytes bounds the input Parse accepts.
const MaxRecipeBytes = 1 << 20

// Recipe is the declarative spec of an image.
type Recipe struct {
	// Base is the image to start from: "debian:bookworm-slim",
	// "reg:5000/x/y@sha256:...". A reference without a registry is resolved
	// by the caller against imageService.runner.baseImageRegistry. Parse
	// fills in DefaultBase when the document names none.
	Base  string `json:"base" yaml:"base"`
	Steps []Step `json:"steps,omitempty" yaml:"steps,omitempty"`
	// User is the image's default user: a name or uid[:gid].
	User string `json:"user,omitempty" yaml:"user,omitempty"`
	// Entrypoint and Cmd replace the base's when non-empty; an empty list
	// keeps the base's (there is no way to clear them).
	Entrypoint []string `json:"entrypoint,omitempty" yaml:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty" yaml:"cmd,omitempty"`
}

// Step is one build step: exactly one of the fields is set.
type Step struct {
	// Run is a shell command, run with /bin/sh -c.
	Run string `json:"run,omitempty" yaml:"run,omitempty"`
	// Env sets environment variables for later steps and the image.
	Env map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Workdir sets the working directory of later steps and the image.
	Workdir string `json:"workdir,omitempty" yaml:"workdir,omitempty"`
	// Copy puts a local file or directory into the image.
	Copy *Copy `json:"copy,omitempty" yaml:"copy,omitempty"`
	// Apt installs Debian packages; rendered into a run step.
	Apt []string `json:"apt,omitempty" yaml:"apt,omitempty"`
	// Pip installs Python packages; rendered into a run step.
	Pip []string `json:"pip,omitempty" yaml:"pip,omitempty"`
}

// Copy copies Src (client side) to Dst (in the image).
type Copy struct {
	// Src is a local path, relative to the recipe file's directory (for the
	// SDK: to the working directory). It never enters a key.
	Src string `json:"src" yaml:"src"`
	// Dst is an absolute path in the image: a directory source's entries
	// land under it, a file source becomes Dst/<base name>.
	Dst string `json:"dst" yaml:"dst"`
	// Blob is "sha256:<hex>" of TarSource's tar of Src, filled by the client
	// after upload. Users do not write it (hence yaml:"-"), but Parse
	// accepts it so that Parse(Marshal(r)) keeps it.
	Blob string `json:"blob,omitempty" yaml:"-"`
}

// The wire types mirror the public ones for decoding, with blob decodable.
type recipeWire struct {
	Base       string     `yaml:"base"`
	Steps      []stepWire `yaml:"steps"`
	User       string     `yaml:"user"`
	Entrypoint []string   `yaml:"entrypoint"`
	Cmd        []string   `yaml:"cmd"`
}

type stepWire struct {
	Run     string            `yaml:"run"`
	Env     map[string]string `yaml:"env"`
	Workdir string            `yaml:"workdir"`
	Copy    *copyWire         `yaml:"copy"`
	Apt     []string          `yaml:"apt"`
	Pip     []string          `yaml:"pip"`
}

type copyWire struct {
	Src  string `yaml:"src"`
	Dst  string `yaml:"dst"`
	Blob string `yaml:"blob"`
}

var (
	recipeFields = []string{"base", "steps", "user", "entrypoint", "cmd"}
	stepFields   = []string{"run", "env", "workdir", "copy", "apt", "pip"}
	copyFields   = []string{"src", "dst", "blob"}
)

// Parse reads a recipe from YAML or JSON (JSON is read as YAML, of which it
// is a subset). Unknown or repeated fields are errors naming the field and
// its line; anchors, aliases and more than one document are refused. Empty
// lists and maps become nil. Parse does not validate: call Validate.
func Parse(data []byte) (r *Recipe, err error) {
	if len(data) > MaxRecipeBytes {
		return nil, fmt.Errorf("recipe: %d bytes, at most %d", len(data), MaxRecipeBytes)
	}
	// The YAML library is a parser of untrusted input: whatever it does, a
	// bad recipe is an error, not a crash.
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("recipe: malformed YAML (%v)", p)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err == io.EOF {
		return nil, errors.New("recipe: empty")
	} else if err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, fmt.Errorf("recipe: %w", err)
		}
		return nil, fmt.Errorf("recipe: line %d: a second YAML document; a recipe is one", extra.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("recipe: line %d: want a mapping with base and steps", root.Line)
	}
	if err := checkNode(root); err != nil {
		return nil, err
	}
	var w recipeWire
	if err := root.Decode(&w); err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	return w.recipe(), nil
}

// checkNode refuses anchors and aliases, and unknown or repeated fields.
func checkNode(root *yaml.Node) error {
	var errs []error
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.AliasNode || n.Anchor != "" {
			errs = append(errs, fmt.Errorf("recipe: line %d: YAML anchors and aliases are not supported", n.Line))
			return
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	errs = append(errs, checkFields(root, "recipe", recipeFields)...)
	if steps := field(root, "steps"); steps != nil && steps.Kind == yaml.SequenceNode {
		for i, s := range steps.Content {
			path := fmt.Sprintf("steps[%d]", i)
			errs = append(errs, checkFields(s, path, stepFields)...)
			if c := field(s, "copy"); c != nil {
				errs = append(errs, checkFields(c, path+".copy", copyFields)...)
			}
			if e := field(s, "env"); e != nil {
				errs = append(errs, checkFields(e, path+".env", nil)...)
			}
		}
	}
	return errors.Join(errs...)
}

// checkFields reports keys of mapping n not in known (any key when known is
// nil) and keys given twice. Non-mappings are left to the decoder.
func checkFields(n *yaml.Node, path string, known []string) []error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	var errs []error
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("recipe: line %d: %s: a key must be a plain string", k.Line, path))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			errs = append(errs, fmt.Errorf("recipe: line %d: %s: field %q given twice (first at line %d)", k.Line, path, k.Value, line))
			continue
		}
		seen[k.Value] = k.Line
		if known != nil && !slices.Contains(known, k.Value) {
			errs = append(errs, fmt.Errorf("recipe: line %d: %s: unknown field %q (known: %s)", k.Line, path, k.Value, strings.Join(known, ", ")))
		}
	}
	return errs
}

// field returns the value of key name in mapping n, or nil.
func field(n *yaml.Node, name string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == name {
			return n.Content[i+1]
		}
	}
	return nil
}

// DefaultBase is the base of a recipe document that names none: the
// levers9-runner image (Debian with Python 3), from
// imageService.runner.baseImageRegistry.
const DefaultBase = "levers9-runner:latest"

func (w *recipeWire) recipe() *Recipe {
	r := &Recipe{Base: cmp.Or(w.Base, DefaultBase), User: w.User, Entrypoint: nonEmpty(w.Entrypoint), Cmd: nonEmpty(w.Cmd)}
	for _, s := range w.Steps {
		st := Step{Run: s.Run, Workdir: s.Workdir, Apt: nonEmpty(s.Apt), Pip: nonEmpty(s.Pip)}
		if len(s.Env) > 0 {
			st.Env = s.Env
		}
		if s.Copy != nil {
			st.Copy = &Copy{Src: s.Copy.Src, Dst: s.Copy.Dst, Blob: s.Copy.Blob}
		}
		r.Steps = append(r.Steps, st)
	}
	return r
}

func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// Marshal returns r's canonical JSON: fields in declaration order, map keys
// sorted, no HTML escaping, Copy.Blob included, and every rune YAML cannot
// carry literally written as a \u escape so that Parse(Marshal(r)) gives r
// back. This is what the CLI and the SDK send to the controlplane.
func Marshal(r *Recipe) ([]byte, error) {
	if r == nil {
		return nil, errors.New("recipe: nil recipe")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.normalized()); err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	return yamlSafe(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// normalized is a copy of r with empty lists and maps as nil, the form
// Parse returns.
func (r *Recipe) normalized() *Recipe {
	c := r.clone()
	c.Entrypoint, c.Cmd = nonEmpty(c.Entrypoint), nonEmpty(c.Cmd)
	if len(c.Steps) == 0 {
		c.Steps = nil
	}
	for i := range c.Steps {
		s := &c.Steps[i]
		s.Apt, s.Pip = nonEmpty(s.Apt), nonEmpty(s.Pip)
		if len(s.Env) == 0 {
			s.Env = nil
		}
	}
	return c
}

// Clone returns a deep copy of r.
func (r *Recipe) Clone() *Recipe { return r.clone() }

func (r *Recipe) clone() *Recipe {
	if r == nil {
		return nil
	}
	c := *r
	c.Entrypoint = slices.Clone(r.Entrypoint)
	c.Cmd = slices.Clone(r.Cmd)
	c.Steps = nil
	if r.Steps != nil {
		c.Steps = make([]Step, len(r.Steps))
		for i, s := range r.Steps {
			c.Steps[i] = s.clone()
		}
	}
	return &c
}

func (s Step) clone() Step {
	c := s
	if s.Env != nil {
		c.Env = make(map[string]string, len(s.Env))
		for k, v := range s.Env {
			c.Env[k] = v
		}
	}
	if s.Copy != nil {
		cp := *s.Copy
		c.Copy = &cp
	}
	c.Apt = slices.Clone(s.Apt)
	c.Pip = slices.Clone(s.Pip)
	return c
}

// yamlSafe rewrites runes that YAML does not accept literally (C0 and C1
// controls other than those encoding/json already escapes, DEL, NEL, the
// byte order mark, U+FFFE/U+FFFF) as \u escapes. encoding/json writes such
// runes only inside strings, where \u escapes mean the same in JSON and YAML.
func yamlSafe(b []byte) []byte {
	if !bytes.ContainsFunc(b, yamlUnsafe) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for len(b) > 0 {
		c, n := utf8.DecodeRune(b)
		if yamlUnsafe(c) {
			out = fmt.Appendf(out, `\u%04x`, c)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

func yamlUnsafe(c rune) bool {
	switch {
	case c == '\t' || c == '\n' || c == '\r':
		return false
	case c < 0x20, c >= 0x7f && c <= 0x9f:
		return true
	case c == 0xfeff, c == 0xfffe, c == 0xffff, c == 0x2028, c == 0x2029:
		return true
	}
	return false
}
