package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/levers9/levers9/enroll"
)

// State is the agent's state directory:
//
//	machine-id           the machine this agent is
//	agent.key            its private key (0600), made here, never sent
//	agent.crt            its client certificate from the controlplane
//	agent-ca.pem         the CA that signs agent certificates
//	controlplane-ca.pem  the CA of the controlplane's TLS certificate, if private
//	agent.json           where the controlplane is (Settings)
//	floor.json           the machine's security floor (--min-* flags)
type State struct {
	Dir string
}

// Settings are what joining learned about the controlplane.
type Settings struct {
	MachineID    string   `json:"machineId"`
	Pool         string   `json:"pool"`
	Controlplane string   `json:"controlplane"`
	TunnelAddrs  []string `json:"tunnelAddrs"`
	// ControlplaneCA is set when the controlplane's certificate needs a
	// private CA.
	ControlplaneCA bool `json:"controlplaneCA"`
	// Labels are the machine's labels (machine create --label), as the
	// enrollment returned them; the inventory reports them.
	Labels map[string]string `json:"labels,omitempty"`
}

func (s State) path(name string) string { return filepath.Join(s.Dir, name) }

// Joined reports whether the state holds a credential for machineID ("" for
// any machine).
func (s State) Joined(machineID string) bool {
	b, err := os.ReadFile(s.path("machine-id"))
	if err != nil {
		return false
	}
	if _, err := os.Stat(s.path("agent.crt")); err != nil {
		return false
	}
	return machineID == "" || strings.TrimSpace(string(b)) == machineID
}

// Settings reads agent.json.
func (s State) Settings() (Settings, error) {
	var st Settings
	b, err := os.ReadFile(s.path("agent.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("%s holds no agent: run the join script (or `levers9-agent join`) first", s.Dir)
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s does not parse: %w", s.path("agent.json"), err)
	}
	return st, nil
}

func (s State) save(st Settings, keyPEM, certPEM, agentCAPEM, cpCAPEM []byte) error {
	// The key is written first and alone with 0600, then the rest; agent.json
	// last, so a crash halfway leaves a state that is not "joined".
	if err := enroll.WriteSecretFile(s.path("agent.key"), keyPEM); err != nil {
		return err
	}
	files := map[string][]byte{"agent.crt": certPEM, "agent-ca.pem": agentCAPEM, "machine-id": []byte(st.MachineID + "\n")}
	if len(cpCAPEM) > 0 {
		files["controlplane-ca.pem"] = cpCAPEM
	}
	for name, b := range files {
		if err := enroll.WriteSecretFile(s.path(name), b); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return enroll.WriteSecretFile(s.path("agent.json"), b)
}
