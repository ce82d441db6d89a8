package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/levers9/levers9/sdk"
)

// Run one command on a GPU machine and use its output. The client comes
// from the levers9 CLI's current context, or LEVERS9_CONTROLPLANE and
// LEVERS9_TOKEN.
func ExampleFunction_Remote() {
	ctx := context.Background()
	client, err := sdk.NewClient(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	train := client.Function("train",
		sdk.Image("registry.example/train:1"),
		sdk.Command("python", "train.py"),
		sdk.GPU(1, ""), sdk.Pool("gpu"),
		sdk.Memory(16*sdk.GiB), sdk.Timeout(2*time.Hour),
		sdk.Retries(2), // a reclaimed spot machine costs a retry, not the result
	)
	res, err := train.Remote(ctx, "--epochs", "3")
	var te *sdk.TaskError
	switch {
	case errors.As(err, &te) && te.ExitCode != 0:
		log.Fatalf("training failed with %d:\n%s", te.ExitCode, res.Stderr)
	case err != nil:
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}

// Run many inputs, at most four at a time; results come back in input
// order.
func ExampleFunction_Map() {
	ctx := context.Background()
	client, err := sdk.NewClient(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	resize := client.Function("resize", sdk.Command("convert"), sdk.CPU(1))
	inputs := [][]string{{"a.png", "a-small.png"}, {"b.png", "b-small.png"}}
	results, errs := resize.Map(ctx, inputs, sdk.Concurrency(4))
	for i := range inputs {
		if errs[i] != nil {
			fmt.Println(inputs[i][0], "failed:", errs[i])
			continue
		}
		fmt.Println(inputs[i][0], "done in", results[i].Attempts, "attempt(s)")
	}
}

// Submit now, follow later (from another process, after a restart, ...):
// keep the last cursor to resume after it.
func ExampleClient_Follow() {
	ctx := context.Background()
	client, err := sdk.NewClient(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	task, err := client.Function("nightly", sdk.Command("./nightly.sh")).Submit(ctx)
	if err != nil {
		log.Fatal(err)
	}
	cursor := ""
	err = client.Follow(ctx, task.Id, cursor, func(ev *sdk.TaskEvent) error {
		cursor = ev.Cursor
		if l := ev.GetLog(); l != nil {
			fmt.Println(l.Text)
		}
		return nil
	})
	if err != nil {
		log.Fatalf("follow stopped at %q: %v", cursor, err)
	}
	final, err := client.Task(ctx, task.Id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ended:", sdk.StateName(final.State), sdk.ErrorOf(final))
}
