package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/levers9/levers9/internal/clientconfig"
)

// IO is where the CLI reads and writes; tests use buffers.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

type app struct {
	io     IO
	in     *bufio.Reader
	getenv func(string) string
	// notify starts delivering interrupts (Ctrl-C) for commands that
	// follow a task, and returns a stop function; tests inject their own
	// channel.
	notify  func() (<-chan os.Signal, func())
	context string // --context
	output  string // -o
	timeout time.Duration
}

// New builds the levers9 command tree.
func New(stdio IO, getenv func(string) string) *cobra.Command {
	return newApp(stdio, getenv, notifyInterrupts)
}

func newApp(stdio IO, getenv func(string) string, notify func() (<-chan os.Signal, func())) *cobra.Command {
	a := &app{io: stdio, in: bufio.NewReader(stdio.In), getenv: getenv, notify: notify}
	root := &cobra.Command{
		Use:   "levers9",
		Short: "Run GPU and CPU tasks on machines you own",
		Long: `levers9 runs tasks in hardened containers on your own machines, which dial out to a
controlplane. This CLI talks to a controlplane over gRPC (TLS on port 443, and on other
ports when the context says tls = true or LEVERS9_CONTROLPLANE_TLS=true).

Contexts live in ~/.levers9/config.toml (mode 0600; LEVERS9_HOME moves it). With no config,
the first command asks for the controlplane and a token; leave the token empty while
LEVERS9_BOOTSTRAP_SECRET is set to create the first workspace and save its admin token.

Environment: LEVERS9_CONTEXT picks a context, LEVERS9_TOKEN overrides its token,
LEVERS9_CONTROLPLANE (+ LEVERS9_TOKEN) skips the config file entirely.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdio.In)
	root.SetOut(stdio.Out)
	root.SetErr(stdio.Err)
	root.PersistentFlags().StringVar(&a.context, "context", "", "use this context instead of the current one")
	root.PersistentFlags().StringVarP(&a.output, "output", "o", "table", "output format of listings: table or json")
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", 30*time.Second, "how long one call to the controlplane may take")
	root.AddCommand(a.configCmd(), a.tokenCmd(), a.secretCmd(), a.volumeCmd(), a.imageCmd(), a.registryCmd(), a.whoamiCmd(), a.machineCmd(), a.poolCmd(), a.securityCmd(),
		a.clusterCmd(), a.runCmd(), a.taskCmd(), a.versionCmd())
	return root
}

// Main runs the CLI and returns the process exit code: 0, 1 on errors, or
// the exit code of the task `run` and `task logs -f` followed.
func Main(args []string, stdio IO, getenv func(string) string) int {
	return mainWith(args, stdio, getenv, notifyInterrupts)
}

func mainWith(args []string, stdio IO, getenv func(string) string, notify func() (<-chan os.Signal, func())) int {
	root := newApp(stdio, getenv, notify)
	root.SetArgs(args)
	err := root.Execute()
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(stdio.Err, "levers9:", ee.msg)
		}
		return ee.code
	}
	if err != nil {
		fmt.Fprintln(stdio.Err, "levers9:", err)
		return 1
	}
	return 0
}

// exitError ends the CLI with a code other than 1 (a task's exit code,
// 124 for a timeout, 130 for an interrupt), with an optional message.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return fmt.Sprintf("exit code %d", e.code)
}

// notifyInterrupts delivers SIGINT and SIGTERM until stopped.
func notifyInterrupts() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	return ch, func() { signal.Stop(ch) }
}

// session is an active context with its connection.
type session struct {
	ctx  Context
	name string
	conn *grpc.ClientConn
	tls  bool
}

func (s *session) Close() { s.conn.Close() }

// connect resolves the active context (prompting on first run) and dials.
func (a *app) connect(needToken bool) (*session, error) {
	c, name, err := a.activeContext()
	if err != nil {
		return nil, err
	}
	if needToken && c.Token == "" {
		return nil, errNoToken
	}
	useTLS, err := UseTLS(c.Controlplane, c.TLS, a.getenv)
	if err != nil {
		return nil, err
	}
	conn, err := Dial(c, a.getenv)
	if err != nil {
		return nil, err
	}
	return &session{ctx: c, name: name, conn: conn, tls: useTLS}, nil
}

func (a *app) activeContext() (Context, string, error) {
	c, name, err := clientconfig.Resolve(a.getenv, a.context)
	if errors.Is(err, ErrNoConfig) {
		dir, err := Dir(a.getenv)
		if err != nil {
			return Context{}, "", err
		}
		return a.firstRun(dir)
	}
	return c, name, err
}

// call runs fn with a timeout and the session's token, and turns errors
// into advice.
func (a *app) call(s *session, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	return a.explain(s, fn(WithToken(ctx, s.ctx.Token)))
}

func (a *app) explain(s *session, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("%s\n(check the token of context %q with `levers9 config list`, or make a new one with `levers9 token create` from a working context)", st.Message(), s.name)
	case codes.PermissionDenied:
		return errors.New(st.Message())
	case codes.NotFound, codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition, codes.ResourceExhausted:
		return errors.New(st.Message())
	case codes.Unavailable, codes.DeadlineExceeded:
		return explainTransport(fmt.Errorf("controlplane %s unavailable: %s", s.ctx.Controlplane, st.Message()), s.ctx, s.tls)
	}
	return fmt.Errorf("%s: %s", st.Code(), st.Message())
}

// prompt asks for one line.
func (a *app) prompt(q string) (string, error) {
	fmt.Fprint(a.io.Err, q)
	line, err := a.in.ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("no answer to %q (stdin closed)", strings.TrimSpace(q))
		}
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// promptSecret asks for a secret without echo when stdin is a terminal.
func (a *app) promptSecret(q string) (string, error) {
	if f, ok := a.io.In.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(a.io.Err, q)
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(a.io.Err)
		return strings.TrimSpace(string(b)), err
	}
	return a.prompt(q)
}

// rpc connects to the active context, runs one call with its token and the
// --timeout, turns errors into advice, and closes the connection.
func rpc[T any](a *app, fn func(ctx context.Context, conn *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	s, err := a.connect(true)
	if err != nil {
		return zero, err
	}
	defer s.Close()
	var out T
	err = a.call(s, func(ctx context.Context) error {
		var err error
		out, err = fn(ctx, s.conn)
		return err
	})
	if err != nil {
		return zero, err
	}
	return out, nil
}
