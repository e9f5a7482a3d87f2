//go:build tools

// The packages hack/build-tools.sh builds from this module.
package tools

import (
	_ "sigs.k8s.io/prometheus-adapter/cmd/adapter"
)
