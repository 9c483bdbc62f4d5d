// Builds CoreDNS from its Go module, for the cluster DNS of tests/node/up's node.
// The version is pinned here and in tests/node/up (coredns_version).
module trainlet.local/coredns

go 1.26.0

require github.com/coredns/coredns v1.15.0
