package server

import (
	"log/slog"

	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

// volumeDrivers are the drivers volumes.* enables: the controlplane only
// creates, deletes and measures volumes (the agents mount them), so the
// seaweedfs driver needs the filer's URL and no weed binary.
func volumeDrivers(cfg *config.Config, log *slog.Logger) api.ConfiguredDrivers {
	var d api.ConfiguredDrivers
	if sw := cfg.Volumes.SeaweedFS; sw.FilerAddr != "" {
		d.SeaweedFS = seaweedfs.New(seaweedfs.Config{FilerAddr: sw.FilerAddr, FilerURL: sw.FilerURL,
			Logger: log.With("component", "volumes")})
	}
	return d
}
