//go:build tools

// The packages hack/build-tools.sh builds from this module: Cluster API's core manager, whose
// main package is the module root.
package tools

import (
	_ "sigs.k8s.io/cluster-api"
)
