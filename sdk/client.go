package sdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/clientconfig"
)

// TaskEvent is one event of a followed task: a state change or an output
// line, with the cursor to resume after it.
type TaskEvent = v1.TaskEvent

// Client talks to one controlplane with one token. It is safe for
// concurrent use; Close it when done.
type Client struct {
	conn     *grpc.ClientConn
	ownsConn bool
	token    string
	// where and useTLS only feed advice in transport errors.
	where  clientconfig.Context
	useTLS bool
	tasks  v1.TaskServiceClient
	getenv func(string) string

	callTimeout time.Duration
	retryWindow time.Duration
	backoffMin  time.Duration
	backoffMax  time.Duration
}

// Option configures NewClient.
type Option func(*clientOptions)

type clientOptions struct {
	contextName string
	getenv      func(string) string
	conn        *grpc.ClientConn
	token       string
	callTimeout time.Duration
	retryWindow time.Duration
	backoffMin  time.Duration
}

// WithContext uses the named context of ~/.levers9/config.toml instead of
// LEVERS9_CONTEXT or the current one.
func WithContext(name string) Option { return func(o *clientOptions) { o.contextName = name } }

// WithGetenv reads the LEVERS9_* settings through getenv instead of
// os.Getenv (for tests, or to configure a client without touching the
// process environment).
func WithGetenv(getenv func(string) string) Option {
	return func(o *clientOptions) { o.getenv = getenv }
}

// WithConn uses an existing connection and token instead of resolving a
// context; Close leaves conn open. The CLI uses it to share its connection.
func WithConn(conn *grpc.ClientConn, token string) Option {
	return func(o *clientOptions) { o.conn, o.token = conn, token }
}

// WithCallTimeout bounds each unary call (submit, get, cancel); default 30s.
func WithCallTimeout(d time.Duration) Option { return func(o *clientOptions) { o.callTimeout = d } }

// WithRetryWindow is how long the client keeps retrying a call or
// reconnecting a follow while the controlplane is unreachable before it
// gives up; default 5 minutes (long enough for a controlplane restart or
// a rolling upgrade).
func WithRetryWindow(d time.Duration) Option { return func(o *clientOptions) { o.retryWindow = d } }

// withBackoffForTest shortens the first reconnect delay.
func withBackoffForTest(d time.Duration) Option { return func(o *clientOptions) { o.backoffMin = d } }

// NewClient connects to a controlplane chosen like the levers9 CLI does:
// LEVERS9_CONTROLPLANE (with LEVERS9_CONTROLPLANE_CA) skips the config
// file; otherwise the context named by WithContext, else LEVERS9_CONTEXT,
// else the current context of ~/.levers9/config.toml (LEVERS9_HOME moves
// it). LEVERS9_TOKEN overrides the token. TLS is used on port 443, and on
// other ports when the context says tls = true or
// LEVERS9_CONTROLPLANE_TLS=true. It does not wait for the connection.
func NewClient(ctx context.Context, opts ...Option) (*Client, error) {
	o := clientOptions{getenv: os.Getenv, callTimeout: 30 * time.Second, retryWindow: 5 * time.Minute, backoffMin: 200 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	if o.callTimeout <= 0 || o.retryWindow <= 0 || o.backoffMin <= 0 {
		return nil, errors.New("levers9 client: call timeout, retry window and backoff must be positive")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &Client{getenv: o.getenv, callTimeout: o.callTimeout, retryWindow: o.retryWindow,
		backoffMin: o.backoffMin, backoffMax: 5 * time.Second}
	if o.conn != nil {
		c.conn, c.token = o.conn, o.token
	} else {
		cc, name, err := clientconfig.Resolve(o.getenv, o.contextName)
		if errors.Is(err, clientconfig.ErrNoConfig) {
			return nil, errors.New("levers9 client: no controlplane configured: set LEVERS9_CONTROLPLANE and LEVERS9_TOKEN, or create a context with `levers9 config create NAME --controlplane HOST:PORT`")
		}
		if err != nil {
			return nil, fmt.Errorf("levers9 client: %w", err)
		}
		if cc.Token == "" {
			return nil, fmt.Errorf("levers9 client: context %s has no token: set LEVERS9_TOKEN", name)
		}
		if c.useTLS, err = clientconfig.UseTLS(cc.Controlplane, cc.TLS, o.getenv); err != nil {
			return nil, fmt.Errorf("levers9 client: %w", err)
		}
		if c.conn, err = clientconfig.Dial(cc, o.getenv); err != nil {
			return nil, fmt.Errorf("levers9 client: %w", err)
		}
		c.ownsConn, c.token, c.where = true, cc.Token, cc
	}
	c.tasks = v1.NewTaskServiceClient(c.conn)
	return c, nil
}

// Close closes the connection the client opened.
func (c *Client) Close() error {
	if c.ownsConn {
		return c.conn.Close()
	}
	return nil
}

// authed adds the token to ctx.
func (c *Client) authed(ctx context.Context) context.Context {
	return clientconfig.WithToken(ctx, c.token)
}

// Task returns a task's current record.
func (c *Client) Task(ctx context.Context, id string) (*v1.Task, error) {
	var resp *v1.GetTaskResponse
	err := c.unary(ctx, "get task "+id, func(ctx context.Context) (err error) {
		resp, err = c.tasks.GetTask(ctx, &v1.GetTaskRequest{Id: id})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Task, nil
}

// maxResultAnswer is the largest GetTaskResult answer the client takes: an
// 8 MiB result and the rest (gRPC's default stops at 4 MiB).
const maxResultAnswer = 16 << 20

// TaskResult returns what a task's last attempt wrote to
// /run/levers9/io/result: Present false when it wrote none (Error says
// why, when it wrote one that was not kept). A task that has not ended is
// an error with code NotFound, as is a task of no one's.
func (c *Client) TaskResult(ctx context.Context, id string) (*v1.GetTaskResultResponse, error) {
	var resp *v1.GetTaskResultResponse
	err := c.unary(ctx, "get the result of task "+id, func(ctx context.Context) (err error) {
		resp, err = c.tasks.GetTaskResult(ctx, &v1.GetTaskResultRequest{Id: id}, grpc.MaxCallRecvMsgSize(maxResultAnswer))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Cancel stops a task that has not finished and returns its record; a
// finished task is returned unchanged.
func (c *Client) Cancel(ctx context.Context, id string) (*v1.Task, error) {
	var resp *v1.CancelTaskResponse
	err := c.unary(ctx, "cancel task "+id, func(ctx context.Context) (err error) {
		resp, err = c.tasks.CancelTask(ctx, &v1.CancelTaskRequest{Id: id})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Task, nil
}

// unary runs an idempotent call with the call timeout, retrying while the
// controlplane is unreachable (up to the retry window).
func (c *Client) unary(ctx context.Context, what string, call func(ctx context.Context) error) error {
	bo := c.newBackoff()
	for {
		cctx, cancel := context.WithTimeout(c.authed(ctx), c.callTimeout)
		err := call(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if !retryable(err) || !bo.wait(ctx) {
			return c.apiErr(what, err)
		}
	}
}

// retryable says whether a call may succeed if repeated: the controlplane
// was unreachable, restarting, or cut the stream. Errors about the request
// itself (not found, invalid, refused) are final.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Internal, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

// APIError is an error the controlplane (or the way to it) returned. Its
// text is the controlplane's message, readable as is; status.Code(err)
// still gives the gRPC code.
type APIError struct {
	// Op says what the client was doing ("submit task", "follow task t_…").
	Op     string
	Status *status.Status
	// advice is added for transport failures (TLS mismatch, nothing
	// listening).
	advice error
}

func (e *APIError) Error() string {
	if e.advice != nil {
		return e.Op + ": " + e.advice.Error()
	}
	return e.Op + ": " + e.Status.Message()
}

// GRPCStatus lets status.FromError and status.Code see the code.
func (e *APIError) GRPCStatus() *status.Status { return e.Status }

func (c *Client) apiErr(op string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	e := &APIError{Op: op, Status: st}
	if st.Code() == codes.Unavailable && c.where.Controlplane != "" {
		if adv := clientconfig.ExplainTransport(errors.New(st.Message()), c.where, c.useTLS); adv.Error() != st.Message() {
			e.advice = adv
		}
	}
	return e
}
