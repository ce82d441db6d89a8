// Package localstack owns `make up` and `make down`: a complete levers9 on
// one machine for development and demos. It keeps everything under
// .levers9-dev/ in the checkout (Postgres and Redis data, a self-signed
// certificate, the controlplane config and its secrets, all 0600), starts
// the servers on free local ports, bootstraps the first workspace and saves
// a CLI context named "local", and starts the dashboard API with development
// sign-in on (dashboard.go). The controlplane config it writes is merged
// with the user's optional levers9.local.yaml (repository root) and
// .levers9-dev/controlplane.local.yaml (merge.go), and one local agent
// runs per declared pool (agent.go). Unless LEVERS9_VOLUMES=0 it runs a
// single-node SeaweedFS for volumes (seaweedfs.go: master, volume server
// and filer, the filer's metadata in the stack's Postgres), hands the
// agents the weed binary, and Down unmounts what their volumes left
// mounted. Running Up twice is harmless. Secrets
// reach the processes through 0600 files, never argv. Not for production.
package localstack

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/devstack"
)

// State is what the stack remembers between runs (.levers9-dev/stack.json,
// mode 0600).
type State struct {
	PostgresPort     int    `json:"postgresPort"`
	PostgresPassword string `json:"postgresPassword"`
	RedisPort        int    `json:"redisPort"`
	RedisPassword    string `json:"redisPassword"`
	EncryptionKey    string `json:"encryptionKey"`
	BootstrapSecret  string `json:"bootstrapSecret"`
	GRPCPort         int    `json:"grpcPort"`
	RESTPort         int    `json:"restPort"`
	TunnelPort       int    `json:"tunnelPort"`
	MetricsPort      int    `json:"metricsPort"`
	RegistryPort     int    `json:"registryPort"`
	DemoImage        string `json:"demoImage,omitempty"`
	// RunnerRootfs and RunnerDigest are the root filesystem key and the
	// digest of the levers9-runner:latest make up last pushed.
	RunnerRootfs string `json:"runnerRootfs,omitempty"`
	RunnerDigest string `json:"runnerDigest,omitempty"`
	AdminToken   string `json:"adminToken,omitempty"`
	// LocalMachineID is the default pool's machine; PoolMachines are the
	// other declared pools' (one agent each).
	LocalMachineID string                  `json:"localMachineId,omitempty"`
	PoolMachines   map[string]*PoolMachine `json:"poolMachines,omitempty"`
	// DashboardPort and DashboardSessionSecret are the dashboard API's.
	DashboardPort          int    `json:"dashboardPort,omitempty"`
	DashboardSessionSecret string `json:"dashboardSessionSecret,omitempty"`
	// DashboardWebPort is the dashboard web app's.
	DashboardWebPort int `json:"dashboardWebPort,omitempty"`
	// SeaweedFS are the local SeaweedFS's ports (nil until it first ran).
	SeaweedFS *SeaweedPorts `json:"seaweedfs,omitempty"`
}

// PoolMachine is the local machine of a pool other than default.
type PoolMachine struct {
	MachineID string `json:"machineId,omitempty"`
	// Slot numbers the agent's container subnets (10.209+Slot.0.0/16).
	Slot int `json:"slot"`
}

// Paths are the stack's files.
type Paths struct {
	Root string // the checkout
	Dir  string // Root/.levers9-dev
	Bin  string // Root/bin
}

// NewPaths returns the paths for a checkout.
func NewPaths(root string) Paths {
	return Paths{Root: root, Dir: filepath.Join(root, ".levers9-dev"), Bin: filepath.Join(root, "bin")}
}

func (p Paths) file(name string) string { return filepath.Join(p.Dir, name) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// loadState reads the state, making a new one with fresh secrets and ports
// when there is none.
func loadState(p Paths) (*State, error) {
	b, err := os.ReadFile(p.file("stack.json"))
	if errors.Is(err, os.ErrNotExist) {
		s := &State{
			PostgresPassword: randomHex(16),
			RedisPassword:    randomHex(16),
			EncryptionKey:    randomHex(32),
			BootstrapSecret:  randomHex(24),
		}
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s does not parse (remove .levers9-dev to start over): %w", p.file("stack.json"), err)
	}
	return &s, nil
}

func (s *State) save(p Paths) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return enroll.WriteSecretFile(p.file("stack.json"), b)
}

// answers reports whether something accepts TCP connections on port.
func answers(port int) bool {
	if port == 0 {
		return false
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// pickPort keeps a remembered port when it is free (or already ours), else
// prefers the documented one, else any free port.
func pickPort(remembered, preferred int, ours bool) (int, error) {
	if remembered != 0 && (ours || !answers(remembered)) {
		return remembered, nil
	}
	if preferred != 0 && !answers(preferred) && udpFree(preferred) {
		return preferred, nil
	}
	return devstack.FreePort()
}

func udpFree(port int) bool {
	c, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	c.Close()
	return true
}
