// Command kubectl-erasure is the kubectl plugin for Lethe's ErasureRequests
// (`kubectl erasure ...` once it is on the PATH).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/lethe-dev/lethe/internal/erasurecli"
)

func main() {
	os.Exit(run())
}

func run() int {
	// Ctrl-C or SIGTERM cancels the command's context, so that plan can
	// remove its planning request before exiting; a second signal, once
	// the context is cancelled, kills the process as usual.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()
	cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		var exit *erasurecli.ExitError
		if errors.As(err, &exit) {
			return exit.Code
		}
		return 1
	}
	return 0
}
