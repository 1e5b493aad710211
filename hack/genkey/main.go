// Command genkey prints a new ed25519 private key as PEM (PKCS #8), the
// format of Lethe's receipt signing key (what `openssl genpkey -algorithm
// ed25519` writes), for the demo and for first installs.
package main

import (
	"fmt"
	"os"

	"github.com/lethe-dev/lethe/internal/evidence"
)

func main() {
	key, err := evidence.GeneratePrivateKeyPEM()
	if err == nil {
		_, err = os.Stdout.Write(key)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genkey:", err)
		os.Exit(1)
	}
}
