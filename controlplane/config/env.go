package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Aliases are the documented short names for some keys; the long form
// (LEVERS9_ + the key path in upper case, dots as underscores) works for
// every scalar key.
var envAliases = map[string]string{
	"LEVERS9_BOOTSTRAP_SECRET":              "controlplane.auth.bootstrapSecret",
	"LEVERS9_REFUSE_DEFAULT_ENCRYPTION_KEY": "refuseDefaultEncryptionKey",
	"LEVERS9_ENCRYPTION_KEY":                "database.postgres.encryptionKey",
	"LEVERS9_PREVIOUS_ENCRYPTION_KEYS":      "database.postgres.previousEncryptionKeys",
	"LEVERS9_POSTGRES_PASSWORD":             "database.postgres.password",
	"LEVERS9_REDIS_PASSWORD":                "database.redis.password",
	"LEVERS9_AGENT_DEV_BUILDS":              "controlplane.agentDevBuilds",
	"LEVERS9_REPLICA_SECRET":                "controlplane.replicaSecret",
	"LEVERS9_PREVIOUS_REPLICA_SECRETS":      "controlplane.previousReplicaSecrets",
}

// EnvName is the long-form environment variable for a key path.
func EnvName(key string) string {
	return "LEVERS9_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// ApplyEnv sets every key whose LEVERS9_* variable is present in env. A
// short alias wins over the long form. List keys take comma-separated
// values. Errors name the variable, never its value.
func ApplyEnv(c *Config, env func(string) (string, bool)) error {
	fields := map[string]reflect.Value{}
	collectFields(reflect.ValueOf(c).Elem(), "", fields)
	var errs []error
	set := func(name, key string) {
		v, ok := env(name)
		if !ok {
			return
		}
		f, known := fields[key]
		if !known {
			return
		}
		if err := setField(f, v); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", name, key, err))
		}
	}
	for key := range fields {
		set(EnvName(key), key)
	}
	for name, key := range envAliases {
		set(name, key)
	}
	return errors.Join(errs...)
}

func collectFields(v reflect.Value, prefix string, out map[string]reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		tag, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		fv := v.Field(i)
		if sf.Type.Kind() == reflect.Struct {
			collectFields(fv, key, out)
			continue
		}
		out[key] = fv
	}
}

func setField(f reflect.Value, v string) error {
	switch f.Kind() {
	case reflect.String:
		f.SetString(v)
	case reflect.Int:
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return errors.New("not a whole number")
		}
		f.SetInt(int64(n))
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return errors.New("not true or false")
		}
		f.SetBool(b)
	case reflect.Pointer:
		if f.Type().Elem().Kind() != reflect.Bool {
			return nil
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return errors.New("not true or false")
		}
		f.Set(reflect.ValueOf(&b))
	case reflect.Slice:
		if f.Type().Elem().Kind() != reflect.String {
			return nil
		}
		var list []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				list = append(list, s)
			}
		}
		f.Set(reflect.ValueOf(list))
	}
	return nil
}
