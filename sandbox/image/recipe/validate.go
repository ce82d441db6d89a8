package recipe

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"
)

// MaxSteps is the most steps a recipe may have.
const MaxSteps = 128

var (
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// An apt package: a Debian package name, optionally :arch and =version.
	aptRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:_-]+)?$`)
	// A pip requirement: a PEP 508 name, optionally ==version or ~=version.
	// Extras, ranges with < or >, URLs and options are not accepted: they
	// need shell metacharacters; write a run step instead.
	pipRE      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?((==|~=)[A-Za-z0-9.+_-]+)?$`)
	userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]*$`)
	blobRE     = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

const (
	maxPackageName = 200
	maxUserName    = 32
)

// forbiddenDirs may not be a workdir or copy destination, nor hold one.
var forbiddenDirs = []string{"/proc", "/sys", "/dev"}

// Validate reports every problem of r at once (errors.Join), each naming
// its field: "base: ...", "steps[2].env[FOO]: ...", "entrypoint[0]: ...".
// Copy.Blob may be empty (it is filled after upload); when set it must be
// "sha256:<64 hex>".
func (r *Recipe) Validate() error {
	if r == nil {
		return errors.New("recipe: nil recipe")
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	switch {
	case r.Base == "":
		add("base: required")
	case !utf8.ValidString(r.Base):
		add("base: not valid UTF-8")
	default:
		if _, err := name.ParseReference(r.Base, name.WeakValidation); err != nil {
			add("base: %q is not an image reference: %v", r.Base, err)
		}
	}
	if len(r.Steps) > MaxSteps {
		add("steps: %d steps, at most %d", len(r.Steps), MaxSteps)
	}
	for i, s := range r.Steps {
		errs = append(errs, s.validate(fmt.Sprintf("steps[%d]", i))...)
	}
	if r.User != "" && !validUser(r.User) {
		add("user: %q is neither a user name ([a-z_][a-z0-9_-]*, at most %d) nor uid[:gid]", r.User, maxUserName)
	}
	errs = append(errs, validArgs("entrypoint", r.Entrypoint)...)
	errs = append(errs, validArgs("cmd", r.Cmd)...)
	return errors.Join(errs...)
}

// kinds lists the fields s sets.
func (s *Step) kinds() []string {
	var k []string
	if s.Run != "" {
		k = append(k, "run")
	}
	if len(s.Env) > 0 {
		k = append(k, "env")
	}
	if s.Workdir != "" {
		k = append(k, "workdir")
	}
	if s.Copy != nil {
		k = append(k, "copy")
	}
	if len(s.Apt) > 0 {
		k = append(k, "apt")
	}
	if len(s.Pip) > 0 {
		k = append(k, "pip")
	}
	return k
}

func (s *Step) validate(at string) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(at+format, args...))
	}
	switch k := s.kinds(); len(k) {
	case 0:
		add(": empty step: set one of run, env, workdir, copy, apt, pip")
		return errs
	case 1:
	default:
		add(": sets %s: a step sets exactly one", strings.Join(k, " and "))
	}
	if s.Run != "" {
		if err := validText(s.Run); err != nil {
			add(".run: %v", err)
		}
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case !envKeyRE.MatchString(k):
			add(".env[%q]: not a POSIX variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		case strings.HasPrefix(strings.ToUpper(k), "LEVERS9_"):
			add(".env[%s]: LEVERS9_* variables are reserved for levers9", k)
		}
		if err := validText(s.Env[k]); err != nil {
			add(".env[%q]: value %v", k, err)
		}
	}
	if s.Workdir != "" {
		if err := validImagePath(s.Workdir); err != nil {
			add(".workdir: %v", err)
		}
	}
	if c := s.Copy; c != nil {
		if c.Src == "" {
			add(".copy.src: required")
		} else if err := validText(c.Src); err != nil {
			add(".copy.src: %v", err)
		}
		if c.Dst == "" {
			add(".copy.dst: required")
		} else if err := validImagePath(c.Dst); err != nil {
			add(".copy.dst: %v", err)
		}
		if c.Blob != "" && !blobRE.MatchString(c.Blob) {
			add(".copy.blob: %q is not sha256:<64 lowercase hex>", c.Blob)
		}
	}
	for j, p := range s.Apt {
		if len(p) > maxPackageName || !aptRE.MatchString(p) {
			add(".apt[%d]: %q is not a Debian package name (name[:arch][=version])", j, p)
		}
	}
	for j, p := range s.Pip {
		if len(p) > maxPackageName || !pipRE.MatchString(p) {
			add(".pip[%d]: %q is not a Python package name (name[==version] or name[~=version]; use a run step for more)", j, p)
		}
	}
	return errs
}

// validText refuses what cannot travel in a command line or environment.
func validText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("contains a NUL byte")
	}
	return nil
}

// validImagePath: absolute, clean, no "..", not in /proc, /sys or /dev.
func validImagePath(p string) error {
	if err := validText(p); err != nil {
		return err
	}
	if !path.IsAbs(p) {
		return fmt.Errorf("%q is not absolute", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("%q has a .. component", p)
		}
	}
	if path.Clean(p) != p {
		return fmt.Errorf("%q is not clean (want %q)", p, path.Clean(p))
	}
	for _, d := range forbiddenDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return fmt.Errorf("%q is under %s", p, d)
		}
	}
	return nil
}

func validUser(u string) bool {
	if userNameRE.MatchString(u) {
		return len(u) <= maxUserName
	}
	uid, gid, hasGID := strings.Cut(u, ":")
	if !validID(uid) {
		return false
	}
	return !hasGID || validID(gid)
}

// validID: a decimal id below 2^32-1 (the kernel's "no id"), no sign or
// leading zeros, so each id has one spelling.
func validID(s string) bool {
	if s == "" || (len(s) > 1 && s[0] == '0') || strings.ContainsAny(s, "+-") {
		return false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n < 1<<32-1
}

func validArgs(field string, args []string) []error {
	var errs []error
	for i, a := range args {
		if err := validText(a); err != nil {
			errs = append(errs, fmt.Errorf("%s[%d]: %v", field, i, err))
		}
	}
	return errs
}
