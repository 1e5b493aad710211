// Command genkey prints a new ed25519 private key as PEM (PKCS #8), the
// format of Lethe's receipt signing key (what `openssl genpkey -algorithm
// ed25519` writes), for the demo and for first installs.
package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
)

func main() {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err == nil {
		var der []byte
		if der, err = x509.MarshalPKCS8PrivateKey(priv); err == nil {
			err = pem.Encode(os.Stdout, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genkey:", err)
		os.Exit(1)
	}
}
