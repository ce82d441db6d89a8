package localstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/levers9/levers9/dashboard/web"
	"github.com/levers9/levers9/enroll"
)

// DashboardWebURL is the local dashboard web app's address for people.
func (s *State) DashboardWebURL() string {
	if s.DashboardWebPort == 0 {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d", s.DashboardWebPort)
}

// pickDashboardWebPort settles the web app's port before the API starts:
// the API needs the web app's origin (CORS, WebSocket Origin checks).
func pickDashboardWebPort(p Paths, st *State) error {
	running := pidAlive(p.file("dashboard-web.pid")) && answers(st.DashboardWebPort)
	var err error
	st.DashboardWebPort, err = pickPort(st.DashboardWebPort, 1998, running)
	if err != nil {
		return fmt.Errorf("pick the dashboard web app's port: %w", err)
	}
	return st.save(p)
}

// ensureDashboardWeb builds the web app for the local API (cached: only
// the first build, or one after a change, takes a minute) and runs it, or
// keeps the running one when it serves the same build.
func ensureDashboardWeb(ctx context.Context, p Paths, webDir string, st *State, say func(string, ...any)) error {
	buildLog, err := os.OpenFile(p.file("dashboard-web-build.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("open the web build log: %w", err)
	}
	defer buildLog.Close()
	say("building the dashboard web app for %s (the first build takes a minute or two; log: %s)", st.DashboardURL(), p.file("dashboard-web-build.log"))
	b, err := web.Make(ctx, web.BuildOptions{Dir: webDir, APIBase: st.DashboardURL(), Log: buildLog})
	if err != nil {
		return fmt.Errorf("build the dashboard web app: %w", err)
	}
	if b.Cached {
		say("dashboard web app: using the cached build %s", b.DistDir)
	} else {
		say("dashboard web app built in %s", b.Took.Round(time.Second))
	}
	running := pidAlive(p.file("dashboard-web.pid")) && answers(st.DashboardWebPort)
	settings := []byte(b.DistDir + " " + strconv.Itoa(st.DashboardWebPort) + "\n")
	old, _ := os.ReadFile(p.file("dashboard/web-settings"))
	if running && string(old) != string(settings) {
		stopProcess(p.file("dashboard-web.pid"), "the dashboard web app (a new build)", say)
		running = false
	}
	if running {
		say("dashboard web app already running on %s", st.DashboardWebURL())
		return nil
	}
	if err := enroll.WriteSecretFile(p.file("dashboard/web-settings"), settings); err != nil {
		return err
	}
	cmd := b.Command("127.0.0.1", st.DashboardWebPort)
	if err := startDetached(cmd, p.file("dashboard-web.log"), p.file("dashboard-web.pid")); err != nil {
		return fmt.Errorf("start the dashboard web app: %w", err)
	}
	say("starting the dashboard web app on %s (log: %s)", st.DashboardWebURL(), p.file("dashboard-web.log"))
	if err := web.WaitHTTP(ctx, st.DashboardWebURL()+"/signin", 60*time.Second, nil); err != nil {
		return fmt.Errorf("the dashboard web app: %w; its log ends:\n%s", err, tail(p.file("dashboard-web.log"), 20))
	}
	return nil
}

// dashboardWebDir is the web app of the checkout make up runs in.
func dashboardWebDir(p Paths) string { return filepath.Join(p.Root, "dashboard", "web") }
