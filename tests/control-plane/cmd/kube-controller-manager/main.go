// Command kube-controller-manager is the upstream one, from the same module as the
// API server: the Job, namespace, garbage-collector, ServiceAccount, StatefulSet and
// ReplicaSet controllers for the lifecycle tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
