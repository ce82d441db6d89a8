package recipe

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// keySeedPrefix versions the key derivation. Change it whenever the
// canonical forms or the chaining below change.
const keySeedPrefix = "levers9-recipe-v1"

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// canonicalStep is what identifies a rendered step: a copy by its content
// and destination, never by its local source path.
type canonicalStep struct {
	Run     string            `json:"run,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Copy    *canonicalCopy    `json:"copy,omitempty"`
}

type canonicalCopy struct {
	Dst  string `json:"dst"`
	Blob string `json:"blob"`
}

// canonicalConfig is what Hash adds to the last step key.
type canonicalConfig struct {
	User       string   `json:"user"`
	Entrypoint []string `json:"entrypoint"`
	Cmd        []string `json:"cmd"`
}

// StepKeys returns one key per rendered step, "sha256:<hex>" each:
//
//	seed   = sha256("levers9-recipe-v1" || baseDigest)
//	key[i] = sha256(key[i-1] || canonical(step i))   (key[-1] = seed)
//
// where key[i-1] and the seed enter as their 32 raw bytes and canonical is
// the step's encoding/json form ({"run":...}, {"env":{sorted}},
// {"workdir":...} or {"copy":{"dst":...,"blob":...}}). baseDigest is the
// digest of the image manifest the build starts from, "sha256:<64 hex>";
// the base's name or tag never enters a key. r must be valid (StepKeys runs
// Validate) and every copy step must have its Blob.
func StepKeys(r *Recipe, baseDigest string) ([]string, error) {
	raw, err := stepKeys(r, baseDigest)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(raw)-1)
	for i, k := range raw[1:] {
		keys[i] = digestString(k)
	}
	return keys, nil
}

// stepKeys returns the seed followed by the step keys.
func stepKeys(r *Recipe, baseDigest string) ([][32]byte, error) {
	if r == nil {
		return nil, errors.New("recipe: nil recipe")
	}
	if !digestRE.MatchString(baseDigest) {
		return nil, fmt.Errorf("recipe: base digest %q is not sha256:<64 lowercase hex>", baseDigest)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	keys := make([][32]byte, 0, len(r.Steps)+1)
	keys = append(keys, sha256.Sum256([]byte(keySeedPrefix+baseDigest)))
	for i, s := range r.Rendered() {
		c := canonicalStep{Run: s.Run, Env: s.Env, Workdir: s.Workdir}
		if s.Copy != nil {
			if s.Copy.Blob == "" {
				return nil, fmt.Errorf("steps[%d].copy: no blob: upload %q first", i, s.Copy.Src)
			}
			c.Copy = &canonicalCopy{Dst: s.Copy.Dst, Blob: s.Copy.Blob}
		}
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("steps[%d]: %w", i, err)
		}
		prev := keys[len(keys)-1]
		keys = append(keys, sha256.Sum256(append(prev[:], b...)))
	}
	return keys, nil
}

// Hash is the image's identity, "sha256:<hex>": sha256 over the last step
// key (the seed when there are no steps), as 32 raw bytes, followed by the
// encoding/json form of {"user":...,"entrypoint":[...],"cmd":[...]} (empty
// lists as null). Same preconditions as StepKeys.
func Hash(r *Recipe, baseDigest string) (string, error) {
	keys, err := stepKeys(r, baseDigest)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(canonicalConfig{User: r.User, Entrypoint: nonEmpty(r.Entrypoint), Cmd: nonEmpty(r.Cmd)})
	if err != nil {
		return "", fmt.Errorf("recipe: %w", err)
	}
	last := keys[len(keys)-1]
	return digestString(sha256.Sum256(append(last[:], b...))), nil
}

func digestString(sum [32]byte) string { return "sha256:" + hex.EncodeToString(sum[:]) }

// StepTag is the registry tag of the image after the step with key k: a
// build pushes every step's image under it, and the controlplane reads it
// back to cache the step.
func StepTag(k string) string { return "step-" + strings.TrimPrefix(k, "sha256:") }

// ImageTag is the registry tag of a recipe's image, by its Hash.
func ImageTag(hash string) string { return strings.TrimPrefix(hash, "sha256:") }
