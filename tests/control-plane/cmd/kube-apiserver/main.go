// Command kube-apiserver is the upstream kube-apiserver, built as an ordinary
// Go module dependency so that trainlet's tests run against the real thing.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
