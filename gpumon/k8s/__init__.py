"""Kubernetes vocabulary: resource names and quantities, selectors, GPU-sharing
annotations, DRA objects and their CEL selectors. Pure values and parsing: no I/O."""
