"""Who may call the exporter's and the controller's HTTP servers: one place for both programs.

- :mod:`.tls`: the server's certificate (and the CA a client trusts), loaded with errors that
  name the file and the config field;
- :mod:`.static`: basic credentials and/or a bearer token from a file (``auth.mode: static``);
- :mod:`.kubernetes`: a bearer token checked with TokenReview and the request with
  SubjectAccessReview (``auth.mode: kubernetes``), as kube-rbac-proxy does;
- :mod:`.guard`: the aiohttp middleware that applies either, leaving the probes open.
"""
