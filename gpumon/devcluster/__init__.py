"""A real local Kubernetes control plane with kwok-simulated GPU nodes, for tests and the demo
(docs/devcluster.md). Pure parts: components, pki, kubeconfig, nodes, capi, poolplan. I/O
shells: cluster (processes), poolsim and nodemaker (API), command (CLI)."""
