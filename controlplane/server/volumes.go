package server

import (
	"fmt"
	"log/slog"

	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

// volumeDrivers are the drivers volumes.* enables: the controlplane only
// creates, deletes and measures volumes (the agents mount them), so the
// seaweedfs driver needs the filer's URL and keys and no weed binary. It
// also returns what agents need to mount a seaweedfs volume (the cluster's
// mount credentials as KEY=VALUE), read once here.
func volumeDrivers(cfg *config.Config, log *slog.Logger) (api.ConfiguredDrivers, []string, error) {
	var d api.ConfiguredDrivers
	sw := cfg.Volumes.SeaweedFS
	if sw.FilerAddr == "" {
		return d, nil, nil
	}
	sec, err := seaweed.LoadSecurity(sw.SecurityDir)
	if err != nil {
		return d, nil, fmt.Errorf("volumes.seaweedfs.securityDir: %w", err)
	}
	creds, err := sec.MountCredentials()
	if err != nil {
		return d, nil, fmt.Errorf("volumes.seaweedfs.securityDir: %w", err)
	}
	d.SeaweedFS = seaweedfs.New(seaweedfs.Config{FilerAddr: sw.FilerAddr, FilerURL: sw.FilerURL, FilerKeys: sec.FilerKeys(),
		Logger: log.With("component", "volumes")})
	return d, creds.Env(), nil
}
