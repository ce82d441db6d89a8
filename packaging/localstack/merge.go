package localstack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/levers9/levers9/controlplane/config"
)

// The user's files merged over the config make up writes, in this order
// (a key in the second wins over the first).
const (
	rootLocalConfig = "levers9.local.yaml"      // at the checkout's root, ignored by git
	devLocalConfig  = "controlplane.local.yaml" // in .levers9-dev/
)

// localConfigFiles are the user's config files, in merge order.
func (p Paths) localConfigFiles() []string {
	return []string{filepath.Join(p.Root, rootLocalConfig), p.file(devLocalConfig)}
}

// managedKeys are the keys make up sets from its own state (ports,
// certificate, secrets): a local file that changed them would cut the
// stack off from its own Postgres, Redis or controlplane.
var managedKeys = []string{
	"controlplane.grpcAddr", "controlplane.restAddr", "controlplane.tunnelAddr", "controlplane.metrics.addr",
	"controlplane.tls", "controlplane.auth.bootstrapSecret", "database",
}

// mergeLocalConfig merges every file of files that exists over base (the
// YAML make up generated), in order, and checks the result with the
// controlplane's own loader (env is what the controlplane will see, for
// its LEVERS9_* overrides). It returns base unchanged when no file exists,
// and the files it merged. Errors name the file and the key.
func mergeLocalConfig(base []byte, files []string, env func(string) (string, bool)) ([]byte, []string, error) {
	var used []string
	out := base
	for _, f := range files {
		user, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("local config: %w", err)
		}
		if out, err = mergeYAML(out, f, user); err != nil {
			return nil, nil, err
		}
		used = append(used, f)
	}
	if len(used) == 0 {
		return base, nil, nil
	}
	if _, err := config.Load(bytes.NewReader(out), env); err != nil {
		return nil, nil, fmt.Errorf("the controlplane config merged with %s: %w", strings.Join(used, " and "), err)
	}
	return out, used, nil
}

// mergeYAML deep-merges the YAML map user (read from the file name) over
// base: keys of user win, maps merge key by key, lists and scalars
// replace. user must only name controlplane config keys (worker.pools
// takes any pool name), none of managedKeys. An empty user leaves base
// as it is.
func mergeYAML(base []byte, name string, user []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(user, &doc); err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", name, err)
	}
	if len(doc.Content) == 0 {
		return base, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: line %d: want a map of config keys (controlplane:, worker:, ...)", name, root.Line)
	}
	if errs := checkKeys(name, root, reflect.TypeOf(config.Config{}), ""); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var over map[string]any
	if err := root.Decode(&over); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var into map[string]any
	if err := yaml.Unmarshal(base, &into); err != nil {
		return nil, fmt.Errorf("the generated controlplane config: %w", err)
	}
	if into == nil {
		into = map[string]any{}
	}
	deepMerge(into, over)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(into); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b.Bytes(), nil
}

// deepMerge sets every key of src in dst: maps on both sides merge,
// anything else (lists, scalars, null) replaces.
func deepMerge(dst, src map[string]any) {
	for k, v := range src {
		sm, sok := v.(map[string]any)
		dm, dok := dst[k].(map[string]any)
		if sok && dok {
			deepMerge(dm, sm)
			continue
		}
		dst[k] = v
	}
}

// checkKeys walks n against the config type t (through its yaml tags) and
// reports every unknown or managed key, as "FILE: line N: KEY: ...".
func checkKeys(name string, n *yaml.Node, t reflect.Type, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	bad := func(line int, key, format string, args ...any) error {
		return fmt.Errorf("%s: line %d: %s: %s", name, line, key, fmt.Sprintf(format, args...))
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return []error{bad(n.Line, path, "want a map of keys, not a single value or a list")}
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if tag != "" && tag != "-" {
				fields[tag] = t.Field(i).Type
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := join(path, k.Value)
			ft, ok := fields[k.Value]
			switch {
			case !ok:
				known := make([]string, 0, len(fields))
				for f := range fields {
					known = append(known, f)
				}
				sort.Strings(known)
				errs = append(errs, bad(k.Line, key, "unknown key (%s takes %s)", orTop(path), strings.Join(known, ", ")))
			case slices.ContainsFunc(managedKeys, func(m string) bool { return key == m || strings.HasPrefix(key, m+".") }):
				errs = append(errs, bad(k.Line, key, "is set by make up from .levers9-dev/stack.json (ports, certificate, secrets); remove it"))
			default:
				errs = append(errs, checkKeys(name, v, ft, key)...)
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return []error{bad(n.Line, path, "want a map")}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, checkKeys(name, n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))...)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return []error{bad(n.Line, path, "want a list")}
		}
		for i, e := range n.Content {
			errs = append(errs, checkKeys(name, e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return []error{bad(n.Line, path, "want a single value")}
		}
	}
	return errs
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}
