"""The per-node exporter: sample in the background, render once per tick, serve cached bytes.

``sampler`` reads devices (and pod attribution) into an immutable :class:`Snapshot`;
``exposition`` renders a snapshot to Prometheus text/OpenMetrics bytes; ``server`` serves the
latest bytes and never touches a device on the request path.
"""
