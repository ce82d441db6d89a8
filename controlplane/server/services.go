package server

import (
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/auth"
)

// registerServices is the one list of public services; the REST gateway
// registers the same list in rest.go.
func registerServices(g *grpc.Server, deps *api.Deps, authn *auth.Authenticator) {
	v1.RegisterAuthServiceServer(g, &api.AuthService{Deps: deps, Auth: authn})
	v1.RegisterTokenServiceServer(g, &api.TokenService{Deps: deps})
	v1.RegisterSecretServiceServer(g, &api.SecretService{Deps: deps})
	v1.RegisterRegistryServiceServer(g, &api.RegistryService{Deps: deps})
	v1.RegisterWorkspaceServiceServer(g, &api.WorkspaceService{Deps: deps})
	v1.RegisterPoolServiceServer(g, &api.PoolService{Deps: deps})
	v1.RegisterMachineServiceServer(g, &api.MachineService{Deps: deps})
	v1.RegisterEnrollServiceServer(g, &api.EnrollService{Deps: deps})
	v1.RegisterSecurityServiceServer(g, &api.SecurityService{Deps: deps})
	v1.RegisterTaskServiceServer(g, &api.TaskService{Deps: deps})
	v1.RegisterVolumeServiceServer(g, &api.VolumeService{Deps: deps})
	v1.RegisterImageServiceServer(g, &api.ImageService{Deps: deps})
}
