package localstack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/levers9/levers9/dashboard/web"
	"github.com/levers9/levers9/enroll"
)

// dashboardAdmins makes every development sign-in as NAME@localhost an
// admin; other emails sign in as members, to try both roles.
const dashboardAdmins = "@localhost"

// DashboardURL is the local dashboard API's address for people.
func (s *State) DashboardURL() string {
	if s.DashboardPort == 0 {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d", s.DashboardPort)
}

// dashboardEnv is the API's environment: settings as variables, the
// admin token and the session secret as paths of 0600 files, so no secret
// is in argv or in the environment of the process.
func dashboardEnv(p Paths, st *State) []string {
	url := st.DashboardURL()
	env := map[string]string{
		"LEVERS9_DASHBOARD_ADDR":                fmt.Sprintf("127.0.0.1:%d", st.DashboardPort),
		"LEVERS9_DASHBOARD_PUBLIC_URL":          url,
		"LEVERS9_DASHBOARD_CONTROLPLANE":        fmt.Sprintf("127.0.0.1:%d", st.GRPCPort),
		"LEVERS9_DASHBOARD_CONTROLPLANE_TLS":    "true",
		"LEVERS9_DASHBOARD_CONTROLPLANE_CA":     p.file("tls/cert.pem"),
		"LEVERS9_DASHBOARD_TOKEN_FILE":          p.file("dashboard/token"),
		"LEVERS9_DASHBOARD_SESSION_SECRET_FILE": p.file("dashboard/session-secret"),
		"LEVERS9_DASHBOARD_DEV_SIGNIN":          "true",
		"LEVERS9_DASHBOARD_ADMINS":              dashboardAdmins,
	}
	if web := st.DashboardWebURL(); web != "" {
		env["LEVERS9_DASHBOARD_WEB_URL"] = web
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// ensureDashboard starts the dashboard API (or keeps the running one when
// its settings did not change) with development sign-in on.
func ensureDashboard(ctx context.Context, p Paths, st *State, say func(string, ...any)) error {
	running := pidAlive(p.file("dashboard-api.pid")) && answers(st.DashboardPort)
	var err error
	if st.DashboardPort, err = pickPort(st.DashboardPort, 1997, running); err != nil {
		return err
	}
	if st.DashboardSessionSecret == "" {
		st.DashboardSessionSecret = randomHex(32)
	}
	if err := st.save(p); err != nil {
		return err
	}
	if err := enroll.WriteSecretFile(p.file("dashboard/token"), []byte(st.AdminToken)); err != nil {
		return fmt.Errorf("write the dashboard's token file: %w", err)
	}
	if err := enroll.WriteSecretFile(p.file("dashboard/session-secret"), []byte(st.DashboardSessionSecret)); err != nil {
		return fmt.Errorf("write the dashboard's session secret file: %w", err)
	}
	env := dashboardEnv(p, st)
	settings := []byte(strings.Join(env, "\n") + "\n")
	old, _ := os.ReadFile(p.file("dashboard/settings.env"))
	if running && !bytes.Equal(old, settings) {
		stopProcess(p.file("dashboard-api.pid"), "the dashboard API (its settings changed)", say)
		running = false
	}
	if running {
		say("dashboard API already running on %s", st.DashboardURL())
	} else {
		// Only names and paths: the secrets stay in their own files.
		if err := enroll.WriteSecretFile(p.file("dashboard/settings.env"), settings); err != nil {
			return err
		}
		say("starting the dashboard API on %s (development sign-in ON; log: %s)", st.DashboardURL(), p.file("dashboard-api.log"))
		if err := startDashboard(p, env); err != nil {
			return err
		}
	}
	if err := waitDashboard(ctx, p, st); err != nil {
		return err
	}
	say("dashboard API healthy: %s (sign in with any email; NAME%s is an admin)", st.DashboardURL(), dashboardAdmins)
	return nil
}

func startDashboard(p Paths, env []string) error {
	cmd := exec.Command(p.Bin + "/levers9-dashboard-api")
	// Its own environment only (plus PATH and HOME), so no LEVERS9_DASHBOARD_*
	// of the caller's shell changes the local stack behind its back.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	if err := startDetached(cmd, p.file("dashboard-api.log"), p.file("dashboard-api.pid")); err != nil {
		return fmt.Errorf("start %s (run make build first): %w", cmd.Path, err)
	}
	return nil
}

func waitDashboard(ctx context.Context, p Paths, st *State) error {
	if err := web.WaitHTTP(ctx, st.DashboardURL()+"/healthz", 30*time.Second, nil); err != nil {
		return fmt.Errorf("the dashboard API did not become healthy: %w; its log ends:\n%s", err, tail(p.file("dashboard-api.log"), 20))
	}
	return nil
}
