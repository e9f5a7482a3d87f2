"""A real local Kubernetes control plane with kwok-simulated GPU nodes, Cluster API's own
controllers and Karpenter on demand, for tests, the demo and the benchmarks (docs/devcluster.md).
Pure parts: components, pki, kubeconfig, nodes, capi, capi_infra_plan. I/O shells: cluster
(processes), cluster_api, capi_infra, karpenter and nodemaker (API), command (CLI)."""
