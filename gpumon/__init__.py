"""gpumon: GPU fleet monitor and remediation controller for Kubernetes."""

__version__ = "0.1.0"
__all__ = ["__version__"]
