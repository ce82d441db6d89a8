package tasks

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// Task secrets. A task names workspace secrets (TaskSpec.secrets); each
// secret holds KEY=VALUE pairs, and each key becomes an environment
// variable of that name in the task's container, with the secret's value
// for it. Submit checks that every named secret exists, that its keys are
// variable names, and that no key is also in the task's env or in another
// of its secrets; the task row keeps the names only. The Scheduler opens
// the secrets when it pushes an attempt (dispatch) and sends the values in
// TaskAttempt.secret_env for that push only; a secret deleted (or changed
// to clash) by then fails the attempt, and the task, with one sentence.

// SecretOpener opens a workspace's sealed secret: its KEY=VALUE pairs. An
// unknown name is an errdefs.ErrNotFound. Errors never hold a value.
type SecretOpener interface {
	OpenSecret(ctx context.Context, workspaceID, name string) (map[string]string, error)
}

// maxTaskSecrets bounds how many secrets one task names.
const maxTaskSecrets = 32

var secretNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// checkSecretNames reports bad or repeated names in spec.secrets.
func checkSecretNames(spec *v1.TaskSpec) []error {
	var errs []error
	if len(spec.Secrets) > maxTaskSecrets {
		errs = append(errs, fmt.Errorf("secrets: %d named, at most %d", len(spec.Secrets), maxTaskSecrets))
	}
	seen := map[string]bool{}
	for i, n := range spec.Secrets {
		switch {
		case !secretNameRE.MatchString(n):
			errs = append(errs, fmt.Errorf("secrets[%d] %q: not a secret name (1-63 letters, digits, '.', '_' or '-')", i, n))
		case seen[n]:
			errs = append(errs, fmt.Errorf("secrets[%d] %q: named twice", i, n))
		}
		seen[n] = true
	}
	return errs
}

// checkSecrets refuses a task naming a secret its workspace does not have,
// or one whose keys could not all become its variables. Unknown names come
// first and alone, as NotFound.
func (s *Submitter) checkSecrets(ctx context.Context, workspaceID string, spec *v1.TaskSpec) error {
	if len(spec.Secrets) == 0 {
		return nil
	}
	list, err := s.d.store.ListSecrets(ctx, workspaceID)
	if err != nil {
		return err
	}
	keys := map[string][]string{}
	for _, sec := range list {
		keys[sec.Name] = sec.Keys
	}
	var missing []error
	for _, n := range spec.Secrets {
		if _, ok := keys[n]; !ok {
			missing = append(missing, fmt.Errorf("secret %q does not exist in this workspace (levers9 secret list shows them; levers9 secret put %s creates it)", n, n))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("task spec: %w: %w", errdefs.ErrNotFound, errors.Join(missing...))
	}
	if errs := secretKeyProblems(spec, keys); len(errs) > 0 {
		return fmt.Errorf("task spec: %w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	return nil
}

// secretKeyProblems names each key of the named secrets that is not a
// variable name, or that env or an earlier secret also sets.
func secretKeyProblems(spec *v1.TaskSpec, keys map[string][]string) []error {
	var errs []error
	owner := map[string]string{}
	for k := range spec.Env {
		owner[k] = "env"
	}
	for _, n := range spec.Secrets {
		ks := append([]string(nil), keys[n]...)
		sort.Strings(ks)
		for _, k := range ks {
			if !envKeyRE.MatchString(k) {
				errs = append(errs, fmt.Errorf("secret %q key %q: not a variable name (letters, digits, '_', not starting with a digit)", n, k))
				continue
			}
			if o, ok := owner[k]; ok {
				if o != "env" {
					o = fmt.Sprintf("secret %q", o)
				}
				errs = append(errs, fmt.Errorf("secret %q key %q: %s sets it too", n, k, o))
				continue
			}
			owner[k] = n
		}
	}
	return errs
}

// unrunnable is a push that no machine could run (its secrets cannot be
// handed over, its build was replaced): the task fails; summary is the
// attempt's one sentence.
type unrunnable struct{ summary string }

func (e *unrunnable) Error() string { return e.summary }

// openSecrets fills ta.SecretEnv with the task's secrets, opened now.
func (s *Scheduler) openSecrets(ctx context.Context, t store.Task, ta *agentv1.TaskAttempt) error {
	spec := &v1.TaskSpec{}
	if err := protojson.Unmarshal(t.Spec, spec); err != nil {
		return fmt.Errorf("decode the spec of task %s: %w", t.ID, err)
	}
	if len(spec.Secrets) == 0 {
		return nil
	}
	if s.d.secrets == nil {
		return fmt.Errorf("task %s names secrets but this controlplane opens none: %w", t.ID, errdefs.ErrUnavailable)
	}
	keys := map[string][]string{}
	vals := map[string]map[string]string{}
	for _, n := range spec.Secrets {
		v, err := s.d.secrets.OpenSecret(ctx, t.WorkspaceID, n)
		if errdefs.IsNotFound(err) {
			return &unrunnable{summary: fmt.Sprintf("secret %q was deleted before the task started (put it again and resubmit)", n)}
		}
		if err != nil {
			return fmt.Errorf("open secret %q of task %s: %w", n, t.ID, err)
		}
		vals[n] = v
		for k := range v {
			keys[n] = append(keys[n], k)
		}
	}
	if errs := secretKeyProblems(spec, keys); len(errs) > 0 {
		return &unrunnable{summary: fmt.Sprintf("a secret changed after submit and no longer fits the task: %s", strings.ReplaceAll(errs[0].Error(), ". ", "; "))}
	}
	for _, n := range spec.Secrets {
		ta.SecretEnv = append(ta.SecretEnv, envList(vals[n])...)
	}
	return nil
}
