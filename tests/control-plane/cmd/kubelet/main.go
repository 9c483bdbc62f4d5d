// Command kubelet is the upstream kubelet, from the same module as the API server: the
// one real node of tests/node/up runs its pods with containerd.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
