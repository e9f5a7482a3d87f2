"""Where GPU readings come from: the exporters' watch streams, or Prometheus."""
