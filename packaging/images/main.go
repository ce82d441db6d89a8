// Command images builds levers9's container images without a Docker engine
// and pushes them: `go run ./packaging/images --registry HOST/PREFIX` from
// the root of a checkout (make images). See packaging/images/imagebuild.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/levers9/levers9/packaging/images/imagebuild"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	root, _ := os.Getwd()
	if err := imagebuild.Main(ctx, root, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}
