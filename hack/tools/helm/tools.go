//go:build tools

// The packages hack/build-tools.sh builds from this module.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
