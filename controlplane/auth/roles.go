package auth

import (
	"fmt"
	"slices"
	"strings"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// access is who may call a method: anyone (public methods check their own
// credentials, like Authorize's bootstrap secret and Enroll's join token),
// or a token whose role is in roles.
type access struct {
	public bool
	roles  []store.Role
}

var (
	anyone = access{public: true}
	admins = access{roles: []store.Role{store.RoleAdmin}}
	// Roles are not a ladder: machine-join may create machines, which a
	// member may not, and nothing else.
	members = access{roles: []store.Role{store.RoleAdmin, store.RoleMember}}
	joiners = access{roles: []store.Role{store.RoleAdmin, store.RoleMachineJoin}}
)

// methods is the one table of who may call each public RPC, by full gRPC
// method name (REST reaches the same names through the gateway). A method
// missing here is refused to every token, and TestEveryMethodHasARole fails
// until it is added.
var methods = map[string]access{
	v1.AuthService_Authorize_FullMethodName: anyone,
	v1.EnrollService_Enroll_FullMethodName:  anyone,

	v1.TokenService_CreateToken_FullMethodName: admins,
	v1.TokenService_ListTokens_FullMethodName:  admins,
	v1.TokenService_RevokeToken_FullMethodName: admins,

	v1.MachineService_CreateMachine_FullMethodName:           joiners,
	v1.MachineService_ListMachines_FullMethodName:            admins,
	v1.MachineService_GetMachine_FullMethodName:              admins,
	v1.MachineService_DeleteMachine_FullMethodName:           admins,
	v1.SecurityService_GetReadinessReport_FullMethodName:     admins,
	v1.PoolService_ListPools_FullMethodName:                  members,
	v1.WorkspaceService_GetWorkspace_FullMethodName:          members,
	v1.WorkspaceService_SetStorageCredentials_FullMethodName: admins,
	v1.WorkspaceService_GetStorageCredentials_FullMethodName: admins,

	// Secret values are write-only, so a member handles secrets by name.
	v1.SecretService_PutSecret_FullMethodName:    members,
	v1.SecretService_ListSecrets_FullMethodName:  members,
	v1.SecretService_DeleteSecret_FullMethodName: members,
	// Registry passwords are write-only too: list shows hosts and usernames.
	v1.RegistryService_LoginRegistry_FullMethodName:           members,
	v1.RegistryService_ListRegistryCredentials_FullMethodName: members,
	v1.RegistryService_LogoutRegistry_FullMethodName:          members,

	v1.VolumeService_CreateVolume_FullMethodName: members,
	v1.VolumeService_ListVolumes_FullMethodName:  members,
	v1.VolumeService_GetVolume_FullMethodName:    members,
	v1.VolumeService_DeleteVolume_FullMethodName: members,
	// Writing and removing files need what creating a volume needs.
	v1.VolumeService_ListVolumeFiles_FullMethodName:  members,
	v1.VolumeService_GetVolumeFile_FullMethodName:    members,
	v1.VolumeService_PutVolumeFile_FullMethodName:    members,
	v1.VolumeService_DeleteVolumeFile_FullMethodName: members,

	v1.ImageService_BuildImage_FullMethodName:  members,
	v1.ImageService_GetImage_FullMethodName:    members,
	v1.ImageService_ListImages_FullMethodName:  members,
	v1.ImageService_DeleteImage_FullMethodName: members,
	v1.ImageService_StatBlob_FullMethodName:    members,
	v1.ImageService_PutBlob_FullMethodName:     members,

	v1.TaskService_SubmitTask_FullMethodName:    members,
	v1.TaskService_GetTask_FullMethodName:       members,
	v1.TaskService_ListTasks_FullMethodName:     members,
	v1.TaskService_CancelTask_FullMethodName:    members,
	v1.TaskService_FollowTask_FullMethodName:    members,
	v1.TaskService_GetTaskResult_FullMethodName: members,
}

// healthPrefix is the gRPC health service, which needs no token.
const healthPrefix = "/grpc.health.v1.Health/"

// IsPublic reports whether method needs no token.
func IsPublic(method string) bool {
	return methods[method].public || strings.HasPrefix(method, healthPrefix)
}

// Allowed returns nil if a token of role r may call method, or a
// PermissionDenied error of one sentence naming the roles that may.
func Allowed(method string, r store.Role) error {
	a, ok := methods[method]
	if !ok {
		return fmt.Errorf("%s is in no role's table (controlplane/auth/roles.go), so no token may call it: %w", shortMethod(method), errdefs.ErrPermissionDenied)
	}
	if a.public || slices.Contains(a.roles, r) {
		return nil
	}
	names := make([]string, len(a.roles))
	for i, role := range a.roles {
		names[i] = string(role)
	}
	return fmt.Errorf("%s needs a token with role %s, and this token's role is %s (an admin can create one with `levers9 token create --role ROLE`): %w",
		shortMethod(method), strings.Join(names, " or "), r, errdefs.ErrPermissionDenied)
}

// shortMethod turns "/levers9.v1.TokenService/CreateToken" into
// "TokenService.CreateToken".
func shortMethod(method string) string {
	svc, m, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return method
	}
	return svc[strings.LastIndex(svc, ".")+1:] + "." + m
}
