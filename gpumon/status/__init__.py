"""``gpumon status``: the fleet's GPU health and what the controller did about it, read only
from what the controller writes to the cluster (Node taints, conditions, labels, annotations,
Events, its state ConfigMap and its /metrics) plus the cluster's own objects (pods, PDBs,
``/scale`` targets). It keeps no state and needs no controller process of its own, so it works
from any machine with a kubeconfig and after a leader change.

:mod:`read` is the only module doing I/O; it fills a :class:`~gpumon.status.state.ClusterState`.
:mod:`fleet` and :mod:`explain` turn that into the frozen views of :mod:`model` (pure), which
:mod:`render` draws and :mod:`command` prints as a table, JSON or YAML.
"""
