package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

// grpcError answers a failed controlplane call. The controlplane's message
// is passed on for errors about the request itself; others become a
// generic sentence (and a log line), since they may describe the
// dashboard's own token.
func (s *Server) grpcError(w http.ResponseWriter, what string, err error) {
	st, _ := status.FromError(err)
	type m struct {
		status int
		code   string
		pass   bool
	}
	mapped := map[codes.Code]m{
		codes.InvalidArgument:    {http.StatusBadRequest, "invalid_argument", true},
		codes.NotFound:           {http.StatusNotFound, "not_found", true},
		codes.AlreadyExists:      {http.StatusConflict, "already_exists", true},
		codes.FailedPrecondition: {http.StatusConflict, "failed_precondition", true},
		codes.ResourceExhausted:  {http.StatusTooManyRequests, "resource_exhausted", true},
		codes.Unavailable:        {http.StatusBadGateway, "unavailable", false},
		codes.DeadlineExceeded:   {http.StatusGatewayTimeout, "unavailable", false},
		codes.PermissionDenied:   {http.StatusBadGateway, "controlplane_refused", false},
		codes.Unauthenticated:    {http.StatusBadGateway, "controlplane_refused", false},
	}
	mm, ok := mapped[st.Code()]
	if !ok {
		mm = m{http.StatusBadGateway, "internal", false}
	}
	if mm.pass {
		writeError(w, mm.status, mm.code, st.Message())
		return
	}
	if errors.Is(err, context.Canceled) || st.Code() == codes.Canceled {
		return
	}
	s.log.Warn("controlplane call failed", "call", what, "code", st.Code().String(), "err", st.Message())
	msg := "the controlplane could not " + what
	if mm.code == "controlplane_refused" {
		msg += ": it refused the dashboard's token (check LEVERS9_DASHBOARD_TOKEN is a live admin token)"
	}
	writeError(w, mm.status, mm.code, msg)
}

var taskStateWords = map[string]v1.TaskState{}

func init() {
	for n, v := range v1.TaskState_value {
		if v != 0 {
			taskStateWords[enumWord(n, "TASK_STATE_")] = v1.TaskState(v)
		}
	}
}

// listTasks: GET /api/tasks?state=running&state=pending&pool=P&pageSize=N&pageToken=T
func (s *Server) listTasks(w http.ResponseWriter, r *http.Request, _ caller) {
	q := r.URL.Query()
	req := &v1.ListTasksRequest{PageToken: q.Get("pageToken")}
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			writeError(w, http.StatusBadRequest, "invalid_argument", "pageSize: a number from 1 to 500")
			return
		}
		req.PageSize = int32(n)
	}
	states, ok := parseStates(w, q["state"])
	if !ok {
		return
	}
	req.States = states
	resp, err := s.tasks.ListTasks(s.cp(r.Context()), req)
	if err != nil {
		s.grpcError(w, "list tasks", err)
		return
	}
	pool := q.Get("pool")
	out := struct {
		Tasks         []taskJSON `json:"tasks"`
		NextPageToken string     `json:"nextPageToken,omitempty"`
	}{Tasks: []taskJSON{}, NextPageToken: resp.NextPageToken}
	for _, t := range resp.Tasks {
		if matchesPool(t, pool) {
			out.Tasks = append(out.Tasks, taskView(t))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// matchesPool is the ?pool= filter of the task lists: no pool matches all.
func matchesPool(t *v1.Task, pool string) bool { return pool == "" || t.GetSpec().GetPool() == pool }

func parseStates(w http.ResponseWriter, vals []string) ([]v1.TaskState, bool) {
	var out []v1.TaskState
	for _, v := range vals {
		for _, word := range strings.Split(v, ",") {
			if word = strings.ToLower(strings.TrimSpace(word)); word == "" {
				continue
			}
			st, ok := taskStateWords[word]
			if !ok {
				writeError(w, http.StatusBadRequest, "invalid_argument", "state: "+strconv.Quote(word)+" is not one of pending, scheduled, running, succeeded, failed, cancelled, timed_out")
				return nil, false
			}
			out = append(out, st)
		}
	}
	return out, true
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.tasks.GetTask(s.cp(r.Context()), &v1.GetTaskRequest{Id: r.PathValue("id")})
	if err != nil {
		s.grpcError(w, "read the task", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"task": taskView(resp.Task)})
}

func (s *Server) cancelTask(w http.ResponseWriter, r *http.Request, c caller) {
	resp, err := s.tasks.CancelTask(s.cp(r.Context()), &v1.CancelTaskRequest{Id: r.PathValue("id")})
	if err != nil {
		s.grpcError(w, "cancel the task", err)
		return
	}
	s.log.Info("task cancelled from the dashboard", "task_id", resp.Task.Id, "email", c.sess.Email)
	writeJSON(w, http.StatusOK, map[string]any{"task": taskView(resp.Task)})
}

// taskLogs: GET /api/tasks/{id}/logs?cursor=C&limit=N returns the events
// stored after cursor, at most limit; more says whether to ask again.
func (s *Server) taskLogs(w http.ResponseWriter, r *http.Request, _ caller) {
	q := r.URL.Query()
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5000 {
			writeError(w, http.StatusBadRequest, "invalid_argument", "limit: a number from 1 to 5000")
			return
		}
		limit = n
	}
	ctx, cancel := context.WithCancel(s.cp(r.Context()))
	defer cancel()
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: r.PathValue("id"), Cursor: q.Get("cursor"), NoWait: true})
	if err != nil {
		s.grpcError(w, "read the task's logs", err)
		return
	}
	out := struct {
		Events []eventJSON `json:"events"`
		Cursor string      `json:"cursor"`
		More   bool        `json:"more"`
	}{Events: []eventJSON{}, Cursor: q.Get("cursor")}
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.grpcError(w, "read the task's logs", err)
			return
		}
		out.Events = append(out.Events, eventView(ev))
		out.Cursor = ev.Cursor
		if len(out.Events) == limit {
			out.More = true
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.pools.ListPools(s.cp(r.Context()), &v1.ListPoolsRequest{})
	if err != nil {
		s.grpcError(w, "list pools", err)
		return
	}
	out := []poolJSON{}
	for _, p := range resp.Pools {
		out = append(out, poolView(p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out})
}

func (s *Server) listMachines(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.machines.ListMachines(s.cp(r.Context()), &v1.ListMachinesRequest{Pool: r.URL.Query().Get("pool")})
	if err != nil {
		s.grpcError(w, "list machines", err)
		return
	}
	out := []machineJSON{}
	for _, m := range resp.Machines {
		out = append(out, machineView(m))
	}
	writeJSON(w, http.StatusOK, map[string]any{"machines": out})
}

func (s *Server) getMachine(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.machines.GetMachine(s.cp(r.Context()), &v1.GetMachineRequest{Id: r.PathValue("id")})
	if err != nil {
		s.grpcError(w, "read the machine", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"machine": machineView(resp.Machine)})
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.tokens.ListTokens(s.cp(r.Context()), &v1.ListTokensRequest{IncludeRevoked: r.URL.Query().Get("includeRevoked") == "true"})
	if err != nil {
		s.grpcError(w, "list tokens", err)
		return
	}
	byRole := map[string][]tokenJSON{"admin": {}, "member": {}, "machine_join": {}}
	all := []tokenJSON{}
	for _, t := range resp.Tokens {
		v := tokenView(t)
		all = append(all, v)
		byRole[v.Role] = append(byRole[v.Role], v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": all, "byRole": byRole})
}

var tokenRoles = map[string]v1.Role{"admin": v1.Role_ROLE_ADMIN, "member": v1.Role_ROLE_MEMBER, "machine_join": v1.Role_ROLE_MACHINE_JOIN}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, c caller) {
	var body struct {
		Name string `json:"name"`
		Role string `json:"role"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	role, ok := tokenRoles[body.Role]
	if body.Role == "" {
		role, ok = v1.Role_ROLE_MEMBER, true
	}
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_argument", "role: one of admin, member, machine_join")
		return
	}
	resp, err := s.tokens.CreateToken(s.cp(r.Context()), &v1.CreateTokenRequest{Name: body.Name, Role: role})
	if err != nil {
		s.grpcError(w, "create the token", err)
		return
	}
	s.log.Info("token created from the dashboard", "token_id", resp.Token.Id, "role", body.Role, "email", c.sess.Email)
	writeJSON(w, http.StatusCreated, map[string]any{"token": tokenView(resp.Token), "secret": resp.Secret})
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, c caller) {
	resp, err := s.tokens.RevokeToken(s.cp(r.Context()), &v1.RevokeTokenRequest{Id: r.PathValue("id")})
	if err != nil {
		s.grpcError(w, "revoke the token", err)
		return
	}
	s.log.Info("token revoked from the dashboard", "token_id", resp.Token.Id, "email", c.sess.Email)
	writeJSON(w, http.StatusOK, map[string]any{"token": tokenView(resp.Token)})
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, _ caller) {
	resp, err := s.secrets.ListSecrets(s.cp(r.Context()), &v1.ListSecretsRequest{})
	if err != nil {
		s.grpcError(w, "list secrets", err)
		return
	}
	out := []secretJSON{}
	for _, sec := range resp.Secrets {
		out = append(out, secretJSON{Name: sec.Name, Keys: nonNil(sec.Keys), CreatedAt: tsp(sec.CreatedAt), UpdatedAt: tsp(sec.UpdatedAt)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": out})
}

// securityReport: GET /api/security?pool=P. The report is passed on in the
// proto's JSON form (protojson, camelCase, 64-bit numbers as strings) since
// it is a read-only document the web app lays out as it comes.
func (s *Server) securityReport(w http.ResponseWriter, r *http.Request, _ caller) {
	pool := r.URL.Query().Get("pool")
	if pool == "" {
		pool = "default"
	}
	resp, err := s.security.GetReadinessReport(s.cp(r.Context()), &v1.GetReadinessReportRequest{Pool: pool})
	if err != nil {
		s.grpcError(w, "read the security report", err)
		return
	}
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(resp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "could not encode the report")
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
