package api

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// The JSON shapes of API.md. Enums are lower-case words ("running"),
// times RFC 3339 in UTC, absent times omitted, byte counts numbers.

type taskJSON struct {
	ID            string          `json:"id"`
	State         string          `json:"state"`
	Image         string          `json:"image"`
	Command       []string        `json:"command"`
	Pool          string          `json:"pool"`
	CPUMillis     int64           `json:"cpuMillis"`
	MemoryBytes   uint64          `json:"memoryBytes"`
	GPUs          int32           `json:"gpus"`
	GPUType       string          `json:"gpuType,omitempty"`
	TimeoutSecs   int64           `json:"timeoutSeconds,omitempty"`
	Retries       int32           `json:"retries"`
	Secrets       []string        `json:"secrets"`
	EnvNames      []string        `json:"envNames"`
	CreatedAt     *time.Time      `json:"createdAt,omitempty"`
	FinishedAt    *time.Time      `json:"finishedAt,omitempty"`
	ExitCode      *int32          `json:"exitCode,omitempty"`
	Message       string          `json:"message,omitempty"`
	Attempts      []attemptJSON   `json:"attempts"`
	SeccompLogged []syscallCount  `json:"seccompLogged,omitempty"`
	Machine       string          `json:"machineId,omitempty"`
	Security      *v1SecurityJSON `json:"appliedSecurity,omitempty"`
}

type attemptJSON struct {
	Number       int32           `json:"number"`
	State        string          `json:"state"`
	MachineID    string          `json:"machineId,omitempty"`
	ScheduledAt  *time.Time      `json:"scheduledAt,omitempty"`
	StartedAt    *time.Time      `json:"startedAt,omitempty"`
	FinishedAt   *time.Time      `json:"finishedAt,omitempty"`
	ExitCode     *int32          `json:"exitCode,omitempty"`
	Message      string          `json:"message,omitempty"`
	Reason       string          `json:"reason,omitempty"`
	Summary      string          `json:"summary,omitempty"`
	DroppedLines uint64          `json:"droppedLines"`
	ImageDigest  string          `json:"imageDigest,omitempty"`
	Security     *v1SecurityJSON `json:"appliedSecurity,omitempty"`
}

// v1SecurityJSON is an attempt's applied security.
type v1SecurityJSON struct {
	Runtime         string   `json:"runtime"`
	RuntimeVersion  string   `json:"runtimeVersion,omitempty"`
	Profile         string   `json:"profile"`
	SeccompMode     string   `json:"seccompMode"`
	SeccompSHA256   string   `json:"seccompProfileSha256,omitempty"`
	Capabilities    []string `json:"capabilities"`
	NetRawDropped   bool     `json:"netRawDropped"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
	MaskedPaths     []string `json:"maskedPaths"`
	ReadonlyPaths   []string `json:"readonlyPaths"`
	PathsNote       string   `json:"pathsNote,omitempty"`
	AppArmorProfile string   `json:"apparmorProfile,omitempty"`
	AppArmorNote    string   `json:"apparmorNote,omitempty"`
	EgressMode      string   `json:"egressMode"`
	Notes           []string `json:"notes,omitempty"`
}

type syscallCount struct {
	Syscall string `json:"syscall"`
	Count   uint64 `json:"count"`
}

func enumWord(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

func tsp(t *timestamppb.Timestamp) *time.Time {
	if t == nil {
		return nil
	}
	v := t.AsTime().UTC()
	return &v
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func securityJSON(a *v1.AppliedSecurity) *v1SecurityJSON {
	if a == nil {
		return nil
	}
	return &v1SecurityJSON{Runtime: a.Runtime, RuntimeVersion: a.RuntimeVersion, Profile: a.Profile, SeccompMode: a.SeccompMode,
		SeccompSHA256: a.SeccompProfileSha256, Capabilities: nonNil(a.Capabilities), NetRawDropped: a.NetRawDropped,
		NoNewPrivileges: a.NoNewPrivileges, MaskedPaths: nonNil(a.MaskedPaths), ReadonlyPaths: nonNil(a.ReadonlyPaths),
		PathsNote: a.PathsNote, AppArmorProfile: a.ApparmorProfile, AppArmorNote: a.ApparmorNote, EgressMode: a.EgressMode, Notes: a.Notes}
}

func taskView(t *v1.Task) taskJSON {
	sp := t.GetSpec()
	j := taskJSON{ID: t.Id, State: enumWord(t.State.String(), "TASK_STATE_"), Image: sp.GetImage(), Command: nonNil(sp.GetCommand()),
		Pool: sp.GetPool(), CPUMillis: sp.GetCpuMillis(), MemoryBytes: sp.GetMemoryBytes(), GPUs: sp.GetGpus(), GPUType: sp.GetGpuType(),
		Retries: sp.GetRetries(), Secrets: nonNil(sp.GetSecrets()), EnvNames: []string{}, CreatedAt: tsp(t.CreatedAt),
		FinishedAt: tsp(t.FinishedAt), ExitCode: t.ExitCode, Message: t.Message, Attempts: []attemptJSON{}}
	if sp.GetTimeout() != nil {
		j.TimeoutSecs = int64(sp.GetTimeout().AsDuration() / time.Second)
	}
	// Env values may hold anything a user typed; the dashboard shows names.
	for k := range sp.GetEnv() {
		j.EnvNames = append(j.EnvNames, k)
	}
	for _, a := range t.Attempts {
		j.Attempts = append(j.Attempts, attemptJSON{Number: a.Number, State: enumWord(a.State.String(), "ATTEMPT_STATE_"), MachineID: a.MachineId,
			ScheduledAt: tsp(a.ScheduledAt), StartedAt: tsp(a.StartedAt), FinishedAt: tsp(a.FinishedAt), ExitCode: a.ExitCode,
			Message: a.Message, Reason: reasonWord(a.Reason), Summary: a.Summary, DroppedLines: a.DroppedLines, ImageDigest: a.ImageDigest,
			Security: securityJSON(a.AppliedSecurity)})
	}
	if n := len(t.Attempts); n > 0 {
		last := t.Attempts[n-1]
		j.Machine, j.Security = last.MachineId, securityJSON(last.AppliedSecurity)
	}
	for _, s := range t.SeccompLogged {
		j.SeccompLogged = append(j.SeccompLogged, syscallCount{Syscall: s.Syscall, Count: s.Count})
	}
	return j
}

func reasonWord(r v1.FailureReason) string {
	if r == v1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		return ""
	}
	return enumWord(r.String(), "FAILURE_REASON_")
}

type gpuJSON struct {
	Index         int32  `json:"index"`
	UUID          string `json:"uuid"`
	Name          string `json:"name"`
	MemoryBytes   uint64 `json:"memoryBytes"`
	DriverVersion string `json:"driverVersion,omitempty"`
	CUDAVersion   string `json:"cudaVersion,omitempty"`
}

type inventoryJSON struct {
	Hostname      string    `json:"hostname"`
	OS            string    `json:"os"`
	Arch          string    `json:"arch"`
	Kernel        string    `json:"kernel"`
	CPUs          int32     `json:"cpus"`
	CPUModel      string    `json:"cpuModel,omitempty"`
	MemoryBytes   uint64    `json:"memoryBytes"`
	DiskBytes     uint64    `json:"diskBytes"`
	DiskFreeBytes uint64    `json:"diskFreeBytes"`
	RuncVersion   string    `json:"runcVersion,omitempty"`
	RunscVersion  string    `json:"runscVersion,omitempty"`
	AppArmor      bool      `json:"apparmor"`
	GPUs          []gpuJSON `json:"gpus"`
}

type machineJSON struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Pool          string            `json:"pool"`
	State         string            `json:"state"`
	Online        bool              `json:"online"`
	Transport     string            `json:"transport,omitempty"`
	AgentVersion  string            `json:"agentVersion,omitempty"`
	CreatedAt     *time.Time        `json:"createdAt,omitempty"`
	EnrolledAt    *time.Time        `json:"enrolledAt,omitempty"`
	LastHeartbeat *time.Time        `json:"lastHeartbeat,omitempty"`
	CertExpiresAt *time.Time        `json:"certificateExpiresAt,omitempty"`
	Labels        map[string]string `json:"labels"`
	Inventory     *inventoryJSON    `json:"inventory,omitempty"`
}

func machineView(m *v1.Machine) machineJSON {
	j := machineJSON{ID: m.Id, Name: m.Name, Pool: m.Pool, State: enumWord(m.State.String(), "MACHINE_STATE_"),
		Online: m.State == v1.MachineState_MACHINE_STATE_ONLINE, Transport: m.Transport, AgentVersion: m.AgentVersion,
		CreatedAt: tsp(m.CreatedAt), EnrolledAt: tsp(m.EnrolledAt), LastHeartbeat: tsp(m.LastHeartbeat),
		CertExpiresAt: tsp(m.CertificateExpiresAt), Labels: m.Labels}
	if j.Labels == nil {
		j.Labels = map[string]string{}
	}
	if inv := m.Inventory; inv != nil {
		ij := &inventoryJSON{Hostname: inv.Hostname, OS: inv.Os, Arch: inv.Arch, Kernel: inv.Kernel, CPUs: inv.Cpus, CPUModel: inv.CpuModel,
			MemoryBytes: inv.MemoryBytes, DiskBytes: inv.DiskBytes, DiskFreeBytes: inv.DiskFreeBytes, RuncVersion: inv.RuncVersion,
			RunscVersion: inv.RunscVersion, AppArmor: inv.Apparmor, GPUs: []gpuJSON{}}
		for _, g := range inv.Gpus {
			ij.GPUs = append(ij.GPUs, gpuJSON{Index: g.Index, UUID: g.Uuid, Name: g.Name, MemoryBytes: g.MemoryBytes, DriverVersion: g.DriverVersion, CUDAVersion: g.CudaVersion})
		}
		j.Inventory = ij
	}
	return j
}

type securitySettingsJSON struct {
	Profile               string   `json:"profile"`
	Seccomp               string   `json:"seccomp"`
	DropNetRaw            bool     `json:"dropNetRaw"`
	BridgePortIsolation   bool     `json:"bridgePortIsolation"`
	EgressMode            string   `json:"egressMode"`
	EgressAllow           []string `json:"egressAllow"`
	Runtime               string   `json:"runtime"`
	AppArmorProfile       string   `json:"apparmorProfile,omitempty"`
	VolumeMountValidation string   `json:"volumeMountValidation,omitempty"`
}

type poolJSON struct {
	Name           string                `json:"name"`
	GPUType        string                `json:"gpuType,omitempty"`
	NodeSelector   map[string]string     `json:"nodeSelector"`
	Security       *securitySettingsJSON `json:"security,omitempty"`
	Machines       int32                 `json:"machines"`
	MachinesOnline int32                 `json:"machinesOnline"`
	GPUsTotal      int32                 `json:"gpusTotal"`
	GPUsFree       int32                 `json:"gpusFree"`
	Shared         bool                  `json:"shared"`
}

func poolView(p *v1.Pool) poolJSON {
	j := poolJSON{Name: p.Name, GPUType: p.GpuType, NodeSelector: p.NodeSelector, Machines: p.Machines, MachinesOnline: p.MachinesOnline,
		GPUsTotal: p.GpusTotal, GPUsFree: p.GpusFree, Shared: p.Shared}
	if j.NodeSelector == nil {
		j.NodeSelector = map[string]string{}
	}
	if s := p.Security; s != nil {
		j.Security = &securitySettingsJSON{Profile: s.Profile, Seccomp: s.Seccomp, DropNetRaw: s.DropNetRaw, BridgePortIsolation: s.BridgePortIsolation,
			EgressMode: s.EgressMode, EgressAllow: nonNil(s.EgressAllow), Runtime: s.Runtime, AppArmorProfile: s.ApparmorProfile,
			VolumeMountValidation: s.VolumeMountValidation}
	}
	return j
}

type tokenJSON struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	CreatedAt  *time.Time `json:"createdAt,omitempty"`
	LastUsedAt *time.Time `json:"lastUsedAt,omitempty"`
	RevokedAt  *time.Time `json:"revokedAt,omitempty"`
	Revoked    bool       `json:"revoked"`
}

func tokenView(t *v1.Token) tokenJSON {
	return tokenJSON{ID: t.Id, Name: t.Name, Role: enumWord(t.Role.String(), "ROLE_"), CreatedAt: tsp(t.CreatedAt),
		LastUsedAt: tsp(t.LastUsedAt), RevokedAt: tsp(t.RevokedAt), Revoked: t.Revoked}
}

type secretJSON struct {
	Name      string     `json:"name"`
	Keys      []string   `json:"keys"`
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	UpdatedAt *time.Time `json:"updatedAt,omitempty"`
}

// eventJSON is one task event on the task WebSocket and in /logs.
type eventJSON struct {
	Type    string         `json:"type"` // "event"
	Cursor  string         `json:"cursor"`
	Time    *time.Time     `json:"time,omitempty"`
	Attempt int32          `json:"attempt"`
	Log     *logJSON       `json:"log,omitempty"`
	State   *stateJSON     `json:"state,omitempty"`
	Seccomp []syscallCount `json:"seccomp,omitempty"`
}

type logJSON struct {
	Stream        string `json:"stream"`
	Text          string `json:"text"`
	DroppedBefore uint64 `json:"droppedBefore,omitempty"`
}

type stateJSON struct {
	TaskState    string `json:"taskState"`
	AttemptState string `json:"attemptState,omitempty"`
	MachineID    string `json:"machineId,omitempty"`
	ExitCode     *int32 `json:"exitCode,omitempty"`
	Message      string `json:"message,omitempty"`
	NewAttempt   bool   `json:"newAttempt,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Summary      string `json:"summary,omitempty"`
}

func eventView(ev *v1.TaskEvent) eventJSON {
	j := eventJSON{Type: "event", Cursor: ev.Cursor, Time: tsp(ev.Time), Attempt: ev.Attempt}
	switch e := ev.Event.(type) {
	case *v1.TaskEvent_Log:
		j.Log = &logJSON{Stream: enumWord(e.Log.Stream.String(), "LOG_STREAM_"), Text: e.Log.Text, DroppedBefore: e.Log.DroppedBefore}
	case *v1.TaskEvent_State:
		st := e.State
		j.State = &stateJSON{TaskState: enumWord(st.TaskState.String(), "TASK_STATE_"), MachineID: st.MachineId, ExitCode: st.ExitCode,
			Message: st.Message, NewAttempt: st.NewAttempt, Reason: reasonWord(st.Reason), Summary: st.Summary}
		if st.AttemptState != v1.AttemptState_ATTEMPT_STATE_UNSPECIFIED {
			j.State.AttemptState = enumWord(st.AttemptState.String(), "ATTEMPT_STATE_")
		}
	case *v1.TaskEvent_Seccomp:
		j.Seccomp = []syscallCount{}
		for _, s := range e.Seccomp.Syscalls {
			j.Seccomp = append(j.Seccomp, syscallCount{Syscall: s.Syscall, Count: s.Count})
		}
	}
	return j
}
