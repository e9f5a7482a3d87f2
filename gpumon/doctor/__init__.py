"""``gpumon doctor``: why monitoring does not work on this node, one check at a time.

One module per check family (:mod:`devices`, :mod:`nvml`, :mod:`podresources`, :mod:`proc`,
:mod:`kubeapi`, :mod:`endpoint`), each split in two: a blocking ``gather`` that reads the
machine and returns frozen facts, and a pure ``judge`` that turns facts into
:class:`~gpumon.doctor.result.CheckResult` values (what was found, and the fix in one line).
:mod:`runner` runs every ``gather`` in a daemon thread with a deadline, so a hung NVML call or
a socket that never answers ends as a failed check instead of a hung doctor.
"""
