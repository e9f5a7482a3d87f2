"""The imperative shell: the long-running loops that feed the core and call the actuators.

Informers fill caches, signal sources keep readings fresh, the leader elector holds the lease,
the remediation loop and the autoscaler loop turn cache contents into plans (core) and plans
into writes (act). :mod:`gpumon.controller.app` only wires them together.
"""
