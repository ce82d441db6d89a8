package auth

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// publicServices lists every method of every service in api/levers9/v1, as
// the descriptors registered by the generated code say, so a new RPC (or a
// new service in a new .proto) shows up here without anyone listing it.
func publicServices(t *testing.T) []string {
	t.Helper()
	_ = v1.File_api_levers9_v1_task_proto // link the package's descriptors
	var out []string
	protoregistry.GlobalFiles.RangeFilesByPackage("levers9.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			s := f.Services().Get(i)
			for j := range s.Methods().Len() {
				out = append(out, "/"+string(s.FullName())+"/"+string(s.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) < 20 {
		t.Fatalf("found only %d methods in levers9.v1: %v", len(out), out)
	}
	return out
}

// Every public RPC has an entry in the role table; a new RPC without one
// fails here (and is refused to every token until it has one).
func TestEveryMethodHasARole(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range publicServices(t) {
		seen[m] = true
		a, ok := methods[m]
		if !ok {
			t.Errorf("%s has no entry in methods (controlplane/auth/roles.go): say which roles may call it", m)
			continue
		}
		if !a.public && Allowed(m, store.RoleAdmin) != nil {
			t.Errorf("%s: admin may not call it; admin may do everything", m)
		}
	}
	for m := range methods {
		if !seen[m] {
			t.Errorf("methods lists %s, which no service in levers9.v1 has", m)
		}
	}
}

// The roles as the issue states them: machine-join may only create
// machines, a member has neither tokens nor machines.
func TestRoleMatrix(t *testing.T) {
	joinerMay := map[string]bool{v1.MachineService_CreateMachine_FullMethodName: true}
	memberMayNot := []string{
		v1.TokenService_CreateToken_FullMethodName, v1.TokenService_ListTokens_FullMethodName, v1.TokenService_RevokeToken_FullMethodName,
		v1.MachineService_CreateMachine_FullMethodName, v1.MachineService_ListMachines_FullMethodName,
		v1.MachineService_GetMachine_FullMethodName, v1.MachineService_DeleteMachine_FullMethodName,
		v1.WorkspaceService_SetStorageCredentials_FullMethodName, v1.WorkspaceService_GetStorageCredentials_FullMethodName,
	}
	for _, m := range publicServices(t) {
		if IsPublic(m) {
			continue
		}
		if err := Allowed(m, store.RoleMachineJoin); (err == nil) != joinerMay[m] {
			t.Errorf("machine-join on %s: %v", m, err)
		}
		if strings.HasPrefix(m, "/levers9.v1.TaskService/") || strings.HasPrefix(m, "/levers9.v1.SecretService/") {
			if err := Allowed(m, store.RoleMember); err != nil {
				t.Errorf("member on %s: %v", m, err)
			}
		}
	}
	for _, m := range memberMayNot {
		err := Allowed(m, store.RoleMember)
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "needs a token with role admin") {
			t.Errorf("member on %s: %v, want a refusal naming admin", m, err)
		}
	}
	// A volume's files need what creating the volume needs, role by role.
	for _, m := range []string{
		v1.VolumeService_ListVolumeFiles_FullMethodName, v1.VolumeService_GetVolumeFile_FullMethodName,
		v1.VolumeService_PutVolumeFile_FullMethodName, v1.VolumeService_DeleteVolumeFile_FullMethodName,
	} {
		for _, r := range []store.Role{store.RoleAdmin, store.RoleMember, store.RoleMachineJoin} {
			if got, want := Allowed(m, r) == nil, Allowed(v1.VolumeService_CreateVolume_FullMethodName, r) == nil; got != want {
				t.Errorf("%s on %s: allowed=%v, CreateVolume allowed=%v", r, m, got, want)
			}
		}
	}
	if err := Allowed("/levers9.v1.TaskService/Nope", store.RoleAdmin); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a method missing from the table: %v, want refused", err)
	}
	if !IsPublic(v1.AuthService_Authorize_FullMethodName) || !IsPublic("/grpc.health.v1.Health/Check") || IsPublic(v1.TaskService_FollowTask_FullMethodName) {
		t.Error("public methods are Authorize, Enroll and health only")
	}
}
