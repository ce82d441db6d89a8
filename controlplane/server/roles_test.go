package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// roleStack is a controlplane with a bootstrapped workspace and one token
// of each role, made through the API by the admin.
type roleStack struct {
	in                    *controlplanetest.Instance
	admin, member, joiner context.Context
	adminID               string
	tokens                v1.TokenServiceClient
	tasks                 v1.TaskServiceClient
}

func startRoles(t *testing.T) *roleStack {
	t.Helper()
	in := controlplanetest.Start(t, roleConfig(t), true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	s := &roleStack{in: in, admin: withToken(context.Background(), a.Token), adminID: a.TokenId,
		tokens: v1.NewTokenServiceClient(in.Conn), tasks: v1.NewTaskServiceClient(in.Conn)}
	s.member = s.token(t, v1.Role_ROLE_MEMBER)
	s.joiner = s.token(t, v1.Role_ROLE_MACHINE_JOIN)
	return s
}

// roleConfig offers a stand-in agent binary (CreateMachine wants one) and
// a default image.
func roleConfig(t *testing.T) *config.Config {
	cfg := env.Config(t)
	cfg.Worker.DefaultImage = "busybox:test"
	controlplanetest.StandInAgent(t, cfg)
	return cfg
}

// token creates a token of role r with the admin token and returns a
// context that sends it.
func (s *roleStack) token(t *testing.T, r v1.Role) context.Context {
	t.Helper()
	resp, err := s.tokens.CreateToken(s.admin, &v1.CreateTokenRequest{Name: "t", Role: r})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Token.Role != r {
		t.Fatalf("created a %v token, got %v", r, resp.Token.Role)
	}
	return withToken(context.Background(), resp.Secret)
}

// wantDenied checks a refusal: PermissionDenied, one sentence naming the
// role that may.
func wantDenied(t *testing.T, what string, err error, role string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "needs a token with role "+role) {
		t.Errorf("%s: %v (%v), want PermissionDenied naming role %s", what, st.Code(), err, role)
	}
}

// Each role is refused what it may not do, over gRPC and REST.
func TestTokenRolesDenied(t *testing.T) {
	t.Parallel()
	s := startRoles(t)
	machines := v1.NewMachineServiceClient(s.in.Conn)
	secrets := v1.NewSecretServiceClient(s.in.Conn)
	workspaces := v1.NewWorkspaceServiceClient(s.in.Conn)

	t.Run("member: no tokens", func(t *testing.T) {
		_, err := s.tokens.CreateToken(s.member, &v1.CreateTokenRequest{Name: "escalate", Role: v1.Role_ROLE_ADMIN})
		wantDenied(t, "member creates an admin token", err, "admin")
		_, err = s.tokens.CreateToken(s.member, &v1.CreateTokenRequest{Name: "another"})
		wantDenied(t, "member creates a member token", err, "admin")
		_, err = s.tokens.ListTokens(s.member, &v1.ListTokensRequest{})
		wantDenied(t, "member lists tokens", err, "admin")
		_, err = s.tokens.RevokeToken(s.member, &v1.RevokeTokenRequest{Id: s.adminID})
		wantDenied(t, "member revokes the admin token", err, "admin")
	})
	t.Run("member: no machines", func(t *testing.T) {
		_, err := machines.CreateMachine(s.member, &v1.CreateMachineRequest{Pool: "default"})
		wantDenied(t, "member creates a machine", err, "admin or machine-join")
		_, err = machines.ListMachines(s.member, &v1.ListMachinesRequest{})
		wantDenied(t, "member lists machines", err, "admin")
		_, err = machines.DeleteMachine(s.member, &v1.DeleteMachineRequest{Id: "m_x"})
		wantDenied(t, "member deletes a machine", err, "admin")
	})
	t.Run("member: no storage credentials", func(t *testing.T) {
		_, err := workspaces.SetStorageCredentials(s.member, &v1.SetStorageCredentialsRequest{Credentials: &v1.StorageCredentials{Endpoint: "e", Bucket: "b", AccessKeyId: "k", SecretAccessKey: "s"}})
		wantDenied(t, "member sets storage credentials", err, "admin")
	})
	t.Run("machine-join: no tasks", func(t *testing.T) {
		_, err := s.tasks.SubmitTask(s.joiner, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo", "x"}}})
		wantDenied(t, "machine-join submits a task", err, "admin or member")
		_, err = s.tasks.ListTasks(s.joiner, &v1.ListTasksRequest{})
		wantDenied(t, "machine-join lists tasks", err, "admin or member")
		st, err := s.tasks.FollowTask(s.joiner, &v1.FollowTaskRequest{Id: "t_x"})
		if err == nil {
			_, err = st.Recv()
		}
		wantDenied(t, "machine-join follows a task", err, "admin or member")
	})
	t.Run("machine-join: no secrets", func(t *testing.T) {
		_, err := secrets.ListSecrets(s.joiner, &v1.ListSecretsRequest{})
		wantDenied(t, "machine-join lists secrets", err, "admin or member")
		_, err = secrets.PutSecret(s.joiner, &v1.PutSecretRequest{Name: "db", Values: map[string]string{"K": "v"}})
		wantDenied(t, "machine-join puts a secret", err, "admin or member")
	})
	t.Run("machine-join: no tokens", func(t *testing.T) {
		_, err := s.tokens.ListTokens(s.joiner, &v1.ListTokensRequest{})
		wantDenied(t, "machine-join lists tokens", err, "admin")
		_, err = s.tokens.CreateToken(s.joiner, &v1.CreateTokenRequest{Name: "x"})
		wantDenied(t, "machine-join creates a token", err, "admin")
	})
	t.Run("machine-join: creates machines and says who it is", func(t *testing.T) {
		if _, err := machines.CreateMachine(s.joiner, &v1.CreateMachineRequest{Pool: "default"}); err != nil {
			t.Errorf("machine-join creates a machine: %v", err)
		}
		_, err := machines.ListMachines(s.joiner, &v1.ListMachinesRequest{})
		wantDenied(t, "machine-join lists machines", err, "admin")
		if _, err := v1.NewAuthServiceClient(s.in.Conn).Authorize(s.joiner, &v1.AuthorizeRequest{}); err != nil {
			t.Errorf("machine-join whoami: %v", err)
		}
	})
	t.Run("rest", func(t *testing.T) {
		created, err := s.tokens.CreateToken(s.admin, &v1.CreateTokenRequest{Name: "rest", Role: v1.Role_ROLE_MEMBER})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://"+s.in.Server.RESTAddr()+"/api/v1/tokens", strings.NewReader(`{"name":"x","role":"ROLE_ADMIN"}`))
		req.Header.Set("Authorization", "Bearer "+created.Secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "needs a token with role admin") {
			t.Errorf("REST token create by a member: %d %s, want 403 naming admin", resp.StatusCode, body)
		}
	})
}

// Roles as tokens carry them: new tokens default to member, the bootstrap
// token is admin, and an unknown role is refused naming the field.
func TestTokenRoleDefaults(t *testing.T) {
	t.Parallel()
	s := startRoles(t)
	created, err := s.tokens.CreateToken(s.admin, &v1.CreateTokenRequest{Name: "ci"})
	if err != nil || created.Token.Role != v1.Role_ROLE_MEMBER {
		t.Errorf("a token created without a role: %v %v, want member", created.GetToken().GetRole(), err)
	}
	_, err = s.tokens.CreateToken(s.admin, &v1.CreateTokenRequest{Name: "x", Role: v1.Role(42)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "role") {
		t.Errorf("an unknown role: %v, want InvalidArgument naming role", err)
	}
	list, err := s.tokens.ListTokens(s.admin, &v1.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]v1.Role{}
	for _, tk := range list.Tokens {
		roles[tk.Id] = tk.Role
	}
	if roles[s.adminID] != v1.Role_ROLE_ADMIN || roles[created.Token.Id] != v1.Role_ROLE_MEMBER {
		t.Errorf("listed roles %v: want the bootstrap token %s admin", roles, s.adminID)
	}
}

// A member runs a task and follows it to its end, and reads it back.
func TestMemberRunsAndFollowsATask(t *testing.T) {
	t.Parallel()
	s := startRoles(t)
	controlplanetest.WaitTunnelEndpoint(t, s.in)
	controlplanetest.StartScriptedMachine(t, s.in, s.admin, "default", 2, 0)
	sub, err := s.tasks.SubmitTask(s.member, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo", "hello", "member"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(s.member, 30*time.Second)
	defer cancel()
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("member follows its task: %v", err)
		}
		if l := ev.GetLog(); l != nil {
			lines = append(lines, l.Text)
		}
	}
	if strings.Join(lines, " ") != "hello member" {
		t.Errorf("member followed lines %q", lines)
	}
	got, err := s.tasks.GetTask(s.member, &v1.GetTaskRequest{Id: sub.Task.Id})
	if err != nil || got.Task.State != v1.TaskState_TASK_STATE_SUCCEEDED {
		t.Errorf("member reads its task: %v %v", got.GetTask().GetState(), err)
	}
	if _, err := s.tasks.ListTasks(s.member, &v1.ListTasksRequest{}); err != nil {
		t.Errorf("member lists tasks: %v", err)
	}
}

// A revoked token's open FollowTask stream ends within a few seconds, even
// though the task (pending: there is no machine) never ends.
func TestRevokedTokenEndsFollow(t *testing.T) {
	t.Parallel()
	s := startRoles(t)
	created, err := s.tokens.CreateToken(s.admin, &v1.CreateTokenRequest{Name: "leaked", Role: v1.Role_ROLE_MEMBER})
	if err != nil {
		t.Fatal(err)
	}
	leaked := withToken(context.Background(), created.Secret)
	sub, err := s.tasks.SubmitTask(leaked, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"echo", "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(leaked, 30*time.Second)
	defer cancel()
	st, err := s.tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetState().GetTaskState() != v1.TaskState_TASK_STATE_PENDING {
		t.Fatalf("first event %v, %v; want PENDING", ev, err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	revoked := time.Now()
	if _, err := s.tokens.RevokeToken(s.admin, &v1.RevokeTokenRequest{Id: created.Token.Id}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		took := time.Since(revoked)
		t.Logf("stream ended %v after the revoke: %v", took.Round(time.Millisecond), err)
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("the stream ended with %v, want Unauthenticated saying the token was revoked", err)
		}
		if took > 5*time.Second {
			t.Errorf("the stream ended %v after the revoke, want within 5s", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a revoked token's FollowTask stream was still open 10s after the revoke")
	}
}
