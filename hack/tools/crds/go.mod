module gpumon.local/tools/crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2
	github.com/prometheus-operator/prometheus-operator v0.93.0
	sigs.k8s.io/cluster-api v1.13.6
)
