// Command levers9 is the levers9 CLI.
package main

import (
	"os"

	"github.com/levers9/levers9/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Getenv))
}
