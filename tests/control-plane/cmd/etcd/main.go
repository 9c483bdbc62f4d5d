// Command etcd is the upstream etcd server, pinned to the version that the
// Kubernetes release in go.mod is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
