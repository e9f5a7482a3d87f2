//go:build tools

// The packages hack/build-tools.sh builds from this module: Karpenter with its kwok cloud
// provider, and the kwok DRA driver that publishes ResourceSlices for the Nodes it creates.
package tools

import (
	_ "sigs.k8s.io/karpenter/dra-kwok-driver"
	_ "sigs.k8s.io/karpenter/kwok"
)
