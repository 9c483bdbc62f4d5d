// Command kube-scheduler is the upstream scheduler, from the same module as the API
// server: on tests/node/up's node, pods are placed by the real thing.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
