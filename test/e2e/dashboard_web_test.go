package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/dashboard/api"
	"github.com/levers9/levers9/dashboard/web"
	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
)

// TestDashboardInBrowser drives the web app in Debian's Chromium in front
// of the dashboard API and the whole stack (real agents, runc): sign in
// with development sign-in, see a task, watch a CLI task's log lines
// arrive live, cancel a task, create and revoke a token (its secret works
// against the controlplane until revoked), see a machine go offline when
// its agent stops. The app's own pages fire no CSP report; an injected
// inline script does. Screenshots of each page go to
// .levers9-dev/screenshots/.
func TestDashboardInBrowser(t *testing.T) {
	chromium, ok := testenv.FindBinary("chromium", "/usr/lib/chromium")
	if !ok {
		testenv.Missing(t, "chromium (packaging/dev/deps.sh installs Debian's)")
	}
	if _, err := web.CheckNode(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	cwd, _ := os.Getwd()
	webDir, err := web.Find(cwd)
	if err != nil {
		t.Fatal(err)
	}
	shots := filepath.Join(webDir, "..", "..", ".levers9-dev", "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}

	// The API base is part of the web build: prefer the port the header
	// tests build for, so one cached build serves both.
	apiPort := web.APIPortForTest
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", apiPort)); err != nil {
		if apiPort, err = devstack.FreePort(); err != nil {
			t.Fatal(err)
		}
	} else {
		l.Close()
	}
	apiBase := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	type built struct {
		b   *web.Build
		err error
	}
	buildDone := make(chan built, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		b, err := web.Make(ctx, web.BuildOptions{Dir: webDir, APIBase: apiBase, Log: testenv.LogWriter(t, "WEB_BUILD_LOG")})
		buildDone <- built{b, err}
	}()

	w := setupTaskWorld(t)
	bd := <-buildDone
	if bd.err != nil {
		t.Fatal(bd.err)
	}
	t.Logf("web build: %s (cached %v, npm ci %v)", bd.b.Took.Round(time.Millisecond), bd.b.Cached, bd.b.Installed)
	webOut := &testenv.SyncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	site, err := bd.b.Serve(ctx, webOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, webOut.String())
	}
	t.Cleanup(site.Stop)

	f, err := clientconfig.LoadFile(w.home)
	if err != nil {
		t.Fatal(err)
	}
	token := f.Contexts["e2e"].Token
	cfg := &api.Config{Addr: fmt.Sprintf("127.0.0.1:%d", apiPort), PublicURL: apiBase, WebURL: site.URL,
		Controlplane: w.in.Server.GRPCAddr(), ControlplaneTLS: true, ControlplaneCA: w.cert, Token: token,
		SessionSecret: "e2e-dashboard-session-secret-0123456789", DevSignIn: true, Admins: []string{"@localhost"},
		PollInterval: 200 * time.Millisecond}
	cfg.WithDefaults()
	srv, err := api.New(cfg, api.Options{Logger: slog.New(slog.NewTextHandler(testenv.LogWriter(t, "DASHBOARD_LOG"), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)

	// The "make up" demo task, run and finished before the browser looks.
	demoOut, errOut, err := w.cli(t, "run", "--", "sh", "-c", `echo "hello from a levers9 task on $(uname -n)"`)
	if err != nil {
		t.Fatalf("demo task: %v %s", err, errOut)
	}
	demoID := taskIDIn(t, demoOut+errOut)

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	browserStart := time.Now()

	// The first call starts the browser, with no timeout: a timeout on it
	// would end the browser.
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, stop := context.WithTimeout(browser, 60*time.Second)
		defer stop()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatalf("%s: %v\nweb server log:\n%s", what, err, webOut.String())
		}
	}
	// until evaluates a JavaScript expression until it is true.
	until := func(what, expr string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			c, stop := context.WithTimeout(browser, 10*time.Second)
			ok, err := chromedp.Run(c, chromedp.Evaluate[bool](expr))
			stop()
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				c, stop := context.WithTimeout(browser, 5*time.Second)
				text, _ := chromedp.Run(c, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
				stop()
				t.Fatalf("timed out after %s waiting for %s (%v); page:\n%.3000s", d, what, err, text)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	shot := func(name string) {
		t.Helper()
		// A task's logs are below the fold: bring them into view.
		browserRun(t, browser, "scroll", chromedp.Evaluate[bool](`(document.querySelector('[data-testid=logs]')?.scrollIntoView({block: 'end'}), true)`))
		png := browserRun(t, browser, "screenshot "+name, chromedp.CaptureScreenshot())
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	visit := func(path, ready string) {
		t.Helper()
		do("open "+path, chromedp.Navigate(site.URL+path), chromedp.WaitVisible(chromedp.CSS(ready)))
	}
	cspLines := func() []string {
		var l []string
		for _, line := range strings.Split(webOut.String(), "\n") {
			if strings.Contains(line, `"msg":"csp-report"`) {
				l = append(l, line)
			}
		}
		return l
	}

	t.Run("development sign-in", func(t *testing.T) {
		do("open the app", chromedp.Navigate(site.URL+"/tasks"),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid=dev-signin]`)))
		until("the banner", `!!document.querySelector('[data-testid=dev-banner]')`, 10*time.Second)
		shot("signin")
		do("sign in", chromedp.SetValue(chromedp.CSS(`input[name=email]`), "ops@localhost"),
			chromedp.Click(chromedp.CSS(`[data-testid=dev-signin] button[type=submit]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid=user-email]`)))
		until("back on /tasks", `location.pathname === '/tasks'`, 10*time.Second)
		if email := browserRun(t, browser, "who", chromedp.Text(chromedp.CSS(`[data-testid=user-email]`))); email != "ops@localhost" {
			t.Fatalf("signed in as %q, want ops@localhost", email)
		}
	})

	t.Run("see the demo task", func(t *testing.T) {
		visit("/tasks", `[data-task="`+demoID+`"]`)
		// Filters: by state, through the table's WebSocket.
		visit("/tasks?state=failed", `[data-testid=empty]`)
		browserRun(t, browser, "add the succeeded filter", chromedp.Evaluate[bool](
			`[...document.querySelectorAll('[data-testid=task-filters] .chip')].find(b => b.textContent === 'succeeded').click() ?? true`))
		until("the demo task under failed,succeeded", `decodeURIComponent(location.search) === '?state=failed,succeeded' && !!document.querySelector('[data-task="`+demoID+`"]')`, 10*time.Second)
		visit("/tasks", `[data-task="`+demoID+`"]`)
		shot("tasks")
		visit("/tasks/"+demoID, `[data-testid=logs] .line`)
		until("exit code 0", `document.querySelector('[data-testid=exit-code]')?.textContent === '0'`, 10*time.Second)
		text := browserRun(t, browser, "logs", chromedp.Text(chromedp.CSS(`[data-testid=logs]`)))
		if !strings.Contains(text, "hello from a levers9 task") || !strings.Contains(text, "attempt 1") {
			t.Errorf("demo task logs: %q", text)
		}
		visit("/", `.stat`)
		shot("overview")
	})

	t.Run("live log lines from a CLI task", func(t *testing.T) {
		const n = 40
		out, errOut, err := w.cli(t, "run", "--detach", "--", "sh", "-c",
			fmt.Sprintf("sleep 2; i=1; while [ $i -le %d ]; do echo tick-$i; i=$((i+1)); sleep 0.15; done", n))
		if err != nil {
			t.Fatalf("run: %v %s", err, errOut)
		}
		id := taskIDIn(t, out+errOut)
		// The table shows it without a reload (task-table WebSocket).
		visit("/tasks", `[data-testid=tasks-table]`)
		until("the new task in the table", fmt.Sprintf(`!!document.querySelector('[data-task=%q]')`, id), 15*time.Second)
		do("open it", chromedp.Click(chromedp.CSS(fmt.Sprintf(`[data-task=%q] a`, id))),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid=logs]`)))
		// Sample the line count while the task runs: it must grow in steps.
		counts := map[int]bool{}
		start := time.Now()
		for time.Since(start) < 30*time.Second {
			c := browserRun(t, browser, "count", chromedp.Evaluate[int](`document.querySelectorAll('[data-testid=logs] .line').length`))
			state := browserRun(t, browser, "state", chromedp.Evaluate[string](`document.querySelector('.pagehead .badge')?.dataset.state ?? ''`))
			counts[c] = true
			if c == n && state == "succeeded" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		partial := 0
		for c := range counts {
			if c > 0 && c < n {
				partial++
			}
		}
		lines := browserRun(t, browser, "lines", chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid=logs] .line')].map(e => e.textContent)`))
		var want []string
		for i := 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("tick-%d", i))
		}
		if fmt.Sprint(lines) != fmt.Sprint(want) {
			t.Fatalf("lines:\n got %v\nwant %v", lines, want)
		}
		if partial < 3 {
			t.Errorf("saw only %d partial line counts while it ran (%v): the lines did not arrive live", partial, counts)
		}
		until("exit code 0", `document.querySelector('[data-testid=exit-code]')?.textContent === '0'`, 10*time.Second)
		until("the attempt marker", `document.querySelector('[data-testid=attempt-marker]')?.textContent.includes('attempt 1 on m_')`, 5*time.Second)
		shot("task")
		t.Logf("%d lines live, %d distinct partial counts seen", n, partial)
	})

	t.Run("cancel a task", func(t *testing.T) {
		out, errOut, err := w.cli(t, "run", "--detach", "--", "sleep", "300")
		if err != nil {
			t.Fatalf("run: %v %s", err, errOut)
		}
		id := taskIDIn(t, out+errOut)
		visit("/tasks/"+id, `[data-testid=cancel]`)
		until("running", `document.querySelector('.pagehead .badge')?.dataset.state === 'running'`, 30*time.Second)
		do("cancel", chromedp.Click(chromedp.CSS(`[data-testid=cancel]`)))
		until("cancelled", `document.querySelector('.pagehead .badge')?.dataset.state === 'cancelled'`, 30*time.Second)
		admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		got, err := v1.NewTaskServiceClient(w.in.Conn).GetTask(admin, &v1.GetTaskRequest{Id: id})
		if err != nil || got.Task.State != v1.TaskState_TASK_STATE_CANCELLED {
			t.Fatalf("controlplane says %v (%v)", got.GetTask().GetState(), err)
		}
	})

	t.Run("create and revoke a token", func(t *testing.T) {
		visit("/tokens", `[data-testid=create-token]`)
		do("create", chromedp.SetValue(chromedp.CSS(`[data-testid=create-token] input[name=name]`), "browser-e2e"),
			chromedp.SetValue(chromedp.CSS(`[data-testid=create-token] select[name=role]`), "member"),
			chromedp.Click(chromedp.CSS(`[data-testid=create-token] button[type=submit]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid=new-secret] .cmd`)))
		secret := strings.TrimSpace(browserRun(t, browser, "secret", chromedp.Text(chromedp.CSS(`[data-testid=new-secret] .cmd`))))
		if !strings.HasPrefix(secret, "levers9_") {
			t.Fatalf("secret shown: %q", secret)
		}
		until("the token row", `!!document.querySelector('[data-token="browser-e2e"]')`, 10*time.Second)
		shot("tokens")
		asToken := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+secret)
		tasks := v1.NewTaskServiceClient(w.in.Conn)
		if _, err := tasks.ListTasks(asToken, &v1.ListTasksRequest{}); err != nil {
			t.Fatalf("the new token does not work: %v", err)
		}
		// Shown once: a reload shows it no more.
		visit("/tokens", `[data-token="browser-e2e"]`)
		page := browserRun(t, browser, "page", chromedp.OuterHTML(chromedp.CSS("main")))
		if strings.Contains(page, secret) {
			t.Fatal("the secret is shown again after a reload")
		}
		do("revoke", chromedp.Click(chromedp.CSS(`[data-token="browser-e2e"] [data-testid=revoke]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-token="browser-e2e"] [data-testid=confirm-revoke]`)),
			chromedp.Click(chromedp.CSS(`[data-token="browser-e2e"] [data-testid=confirm-revoke]`)))
		until("the token gone from the list", `!document.querySelector('[data-token="browser-e2e"]')`, 10*time.Second)
		_, err := tasks.ListTasks(asToken, &v1.ListTasksRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("the revoked token: %v, want Unauthenticated", err)
		}
	})

	t.Run("the other pages", func(t *testing.T) {
		visit("/secrets", `[data-testid=empty], [data-testid=secrets-table]`)
		shot("secrets")
		visit("/security", `[data-testid=security-pool] .grid2`)
		shot("security")
	})

	t.Run("machine offline, and the task's logs follow its retry", func(t *testing.T) {
		// A task on the machine whose agent stops: its attempt is lost and
		// a retry runs elsewhere, in the same live log view.
		out, errOut, err := w.cli(t, "run", "--detach", "--retries", "1", "--", "sh", "-c",
			"i=1; while [ $i -le 600 ]; do echo n-$i; i=$((i+1)); sleep 0.2; done")
		if err != nil {
			t.Fatalf("run: %v %s", err, errOut)
		}
		id := taskIDIn(t, out+errOut)
		admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		tasks := v1.NewTaskServiceClient(w.in.Conn)
		defer func() { _, _ = tasks.CancelTask(admin, &v1.CancelTaskRequest{Id: id}) }()
		var victim string
		testenv.Eventually(t, 60*time.Second, "the task running", func() bool {
			got, err := tasks.GetTask(admin, &v1.GetTaskRequest{Id: id})
			if err != nil || got.Task.State != v1.TaskState_TASK_STATE_RUNNING || len(got.Task.Attempts) == 0 {
				return false
			}
			victim = got.Task.Attempts[len(got.Task.Attempts)-1].GetMachineId()
			return true
		})

		visit("/machines", `[data-testid=machines-table]`)
		until("both online", `document.querySelectorAll('[data-online=true]').length === 2`, 15*time.Second)
		shot("machines")
		stopped := time.Now()
		stopAgent(t, victim)
		until("offline without a reload", fmt.Sprintf(`document.querySelector('[data-machine=%q]')?.dataset.online === 'false'`, victim), 60*time.Second)
		t.Logf("offline shown %s after SIGTERM to the agent", time.Since(stopped).Round(time.Millisecond))

		visit("/tasks/"+id, `[data-testid=logs] .line`)
		until("attempt 2's marker and lines", `!!document.querySelector('[data-testid=attempt-marker][data-attempt="2"]') && !!document.querySelector('[data-testid=logs] .line[data-attempt="2"]')`, 120*time.Second)
		markers := browserRun(t, browser, "markers", chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid=attempt-marker]')].map(e => e.textContent)`))
		joined := strings.Join(markers, "\n")
		if !strings.Contains(joined, "attempt 1 lost") || strings.Count(joined, "attempt 1 lost") != 1 || strings.Contains(joined, "attempt 2 on "+victim) || !strings.Contains(joined, "attempt 2 on m_") {
			t.Errorf("attempt markers:\n%s", joined)
		}
		n2 := `document.querySelectorAll('[data-testid=logs] .line[data-attempt="2"]').length`
		first := browserRun(t, browser, "attempt 2 lines", chromedp.Evaluate[int](n2))
		until("more of attempt 2's lines, live", fmt.Sprintf(`%s > %d`, n2, first+5), 30*time.Second)
		shot("task-retry")
		t.Logf("retry followed %s after the agent stopped", time.Since(stopped).Round(time.Millisecond))

		// The agent starts again: it clears what its stopped self left (the
		// lost attempt's container) and is shown online again.
		if _, err := tasks.CancelTask(admin, &v1.CancelTaskRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		visit("/machines", `[data-testid=machines-table]`)
		w.startAgent(t, w.runs[victim])
		until("online again", fmt.Sprintf(`document.querySelector('[data-machine=%q]')?.dataset.online === 'true'`, victim), 60*time.Second)
		// Both attempts' containers are gone before the test's directories are.
		testenv.Eventually(t, 60*time.Second, "the task's attempts cleaned up on both machines", func() bool {
			for _, r := range w.runs {
				if left, _ := filepath.Glob(filepath.Join(r.root, "state", "images", "tasks", id+".*")); len(left) > 0 {
					return false
				}
			}
			return true
		})
	})

	t.Run("narrow screens", func(t *testing.T) {
		// Tables scroll in their own box: the page itself never scrolls sideways.
		do("phone size", chromedp.EmulateViewport(390, 844))
		defer do("back", chromedp.EmulateViewport(1280, 800))
		for _, page := range []struct{ path, ready string }{
			{"/tasks", `[data-testid=tasks-table]`}, {"/machines", `[data-testid=machines-table]`}, {"/tokens", `[data-testid=tokens-table]`},
		} {
			visit(page.path, page.ready)
			until(page.path+" without sideways scrolling", `document.documentElement.scrollWidth <= window.innerWidth`, 5*time.Second)
		}
		shot("tasks-narrow")
	})

	t.Run("content security policy reports", func(t *testing.T) {
		// Every page above ran under the report-only policy: none may have
		// reported. Reports are posted at once; give stragglers a moment.
		time.Sleep(time.Second)
		if l := cspLines(); len(l) != 0 {
			t.Fatalf("the app's own pages fired CSP reports:\n%s", strings.Join(l, "\n"))
		}
		browserRun(t, browser, "inject an inline script", chromedp.Evaluate[int](`(() => { const s = document.createElement('script'); s.textContent = 'window.injected = 1'; document.body.appendChild(s); return 1 })()`))
		testenv.Eventually(t, 10*time.Second, "a csp-report line for the injected script", func() bool { return len(cspLines()) > 0 })
		l := cspLines()[0]
		if !strings.Contains(l, `"blockedUri":"inline"`) || !strings.Contains(l, "script-src") || !strings.Contains(l, `"documentUri":"`+site.URL+`/tokens"`) {
			t.Errorf("report line: %s", l)
		}
	})
	t.Run("a member sees no admin views", func(t *testing.T) {
		reports := len(cspLines())
		defer func() {
			if l := cspLines(); len(l) != reports {
				t.Errorf("the member's pages fired CSP reports:\n%s", strings.Join(l[reports:], "\n"))
			}
		}()
		visit("/", `[data-testid=user-email]`)
		do("sign out", chromedp.Click(chromedp.CSS(`.user button`)))
		visit("/tokens", `[data-testid=dev-signin]`)
		do("sign in as a member", chromedp.SetValue(chromedp.CSS(`input[name=email]`), "dev@example.com"),
			chromedp.Click(chromedp.CSS(`[data-testid=dev-signin] button[type=submit]`)))
		until("back on /tokens as a member", `location.pathname === '/tokens' && document.querySelector('.user .role')?.textContent === 'member'`, 10*time.Second)
		until("the admin-only notice", `document.querySelector('.problem')?.textContent.includes('needs the admin role') && !document.querySelector('[data-testid=tokens-table]')`, 10*time.Second)
		visit("/machines", `.pool`)
		until("no machine list", `!document.querySelector('[data-testid=machines-table]') && document.body.innerText.includes('needs the admin role')`, 10*time.Second)
		visit("/tasks", `[data-testid=tasks-table]`)
	})
	t.Logf("browser part: %s; screenshots in %s", time.Since(browserStart).Round(time.Millisecond), shots)
}

func taskIDIn(t *testing.T, s string) string {
	t.Helper()
	id := regexp.MustCompile(`t_[a-z2-7]+`).FindString(s)
	if id == "" {
		t.Fatalf("no task ID in %q", s)
	}
	return id
}

// browserRun runs one action that returns a value, within a minute.
func browserRun[T any](t *testing.T, browser context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, stop := context.WithTimeout(browser, 60*time.Second)
	defer stop()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}
