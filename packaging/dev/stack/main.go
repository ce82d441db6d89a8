// Command stack runs `make up` and `make down`: `stack up|down` from the
// root of a levers9 checkout.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/levers9/levers9/packaging/localstack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	root, _ := os.Getwd()
	if err := localstack.Run(ctx, os.Args[1:], localstack.NewPaths(root), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stack:", err)
		os.Exit(1)
	}
}
