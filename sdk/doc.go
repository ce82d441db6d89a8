// Package sdk is the Go client of levers9: it runs commands as tasks on
// your machines and gives back their output as if they ran locally.
//
//	client, err := sdk.NewClient(ctx) // the CLI's current context, or LEVERS9_* env
//	fn := client.Function("train", sdk.Image("registry.local/train:1"), sdk.GPU(1, ""), sdk.Retries(2))
//	res, err := fn.Remote(ctx, "--epochs", "3")
//	fmt.Print(res.Stdout)
//
// It owns: finding the controlplane (the same contexts file and environment
// as the levers9 CLI, see NewClient), submitting with an idempotency key so
// that its own retried submit never runs a task twice, following a task's
// event stream across dropped connections and controlplane restarts (it
// resumes from the last cursor it saw, so nothing is missed or repeated)
// and across attempts (a lost machine starts a new attempt when retries
// remain), turning the final state into a Result and an error, and running
// many tasks with bounded concurrency (Map).
//
// Security tightenings travel in the task's environment:
// LEVERS9_SECURITY_PROFILE and LEVERS9_SECCOMP set with Env, or present in
// this process's environment, are passed to the task; the controlplane and
// agent apply a stricter setting than the pool's and refuse a looser one,
// and that refusal comes back from Remote unchanged.
//
// It must never import a levers9 part other than api/, the shared leaf
// sandbox/image/recipe (image builds describe images with it) and internal
// helpers shared with the CLI; it never logs and never puts a token in an
// error. The API is young: additions are expected, renames are not.
package sdk
