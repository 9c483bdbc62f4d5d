//go:build tools

// Package tools pins Helm's command, which tests/helm/build builds.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
