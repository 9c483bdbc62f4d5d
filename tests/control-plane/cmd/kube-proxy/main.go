// Command kube-proxy is the upstream kube-proxy, from the same module as the API
// server: on tests/node/up's node it makes Service ClusterIPs (the `kubernetes` Service
// that in-cluster clients use) work with iptables.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
