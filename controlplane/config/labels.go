package config

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// MaxLabels is the most labels a machine may carry.
const MaxLabels = 64

// labelName is a Kubernetes label name or value: up to 63 characters,
// alphanumeric at both ends, '-', '_' and '.' inside.
var labelName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$`)

// labelPrefix is a DNS subdomain (lower case), the optional "prefix/" of a
// label key.
var labelPrefix = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// CheckLabel checks one label as Kubernetes does: the key is an optional
// DNS-subdomain prefix (up to 253 characters) and "/", then a name of up to
// 63 characters that starts and ends with a letter or digit and has only
// letters, digits, '-', '_' and '.' between; the value is empty or follows
// the name's rule. The error names the label and the rule it breaks.
func CheckLabel(key, value string) error {
	name := key
	if i := strings.LastIndex(key, "/"); i >= 0 {
		prefix := key[:i]
		name = key[i+1:]
		if prefix == "" || len(prefix) > 253 || !labelPrefix.MatchString(prefix) {
			return fmt.Errorf("label %q: key prefix %q is not a DNS subdomain (lower-case letters, digits, '-' and '.', up to 253 characters)", key, prefix)
		}
	}
	if !labelName.MatchString(name) {
		return fmt.Errorf("label %q: key name %q must be 1 to 63 characters, start and end with a letter or digit, with only letters, digits, '-', '_' and '.' between", key, name)
	}
	if value != "" && !labelName.MatchString(value) {
		return fmt.Errorf("label %q: value %q must be empty or up to 63 characters, start and end with a letter or digit, with only letters, digits, '-', '_' and '.' between", key, value)
	}
	return nil
}

// CheckLabels checks every label (in key order) and their number; each
// problem is prefixed with field and returned, none when all are good.
func CheckLabels(field string, labels map[string]string) []error {
	var errs []error
	if len(labels) > MaxLabels {
		errs = append(errs, fmt.Errorf("%s: %d labels, at most %d", field, len(labels), MaxLabels))
	}
	for _, k := range sortedKeys(labels) {
		if err := CheckLabel(k, labels[k]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	return errs
}

// Unselected lists, in key order, the labels of selector that labels lacks
// or holds with another value, each as "key=value"; none means the labels
// match.
func Unselected(selector, labels map[string]string) []string {
	var out []string
	for _, k := range sortedKeys(selector) {
		if v, ok := labels[k]; !ok || v != selector[k] {
			out = append(out, k+"="+selector[k])
		}
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
