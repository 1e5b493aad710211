// Command kubectl-erasure is the kubectl plugin for Lethe's ErasureRequests
// (`kubectl erasure ...` once it is on the PATH).
package main

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/lethe-dev/lethe/internal/erasurecli"
)

func main() {
	cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		var exit *erasurecli.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.Code)
		}
		os.Exit(1)
	}
}
