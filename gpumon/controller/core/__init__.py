"""The controller's functional core: what to do, decided from values alone.

Purely data and computation: no I/O, no clock (``now`` is a parameter), no asyncio, aiohttp,
kubernetes_asyncio or logging. Every decision is a function of (cluster views, signals, time,
policy) returning a plan; :mod:`gpumon.controller.act` carries plans out and
:mod:`gpumon.controller.shell` runs the loops. The import contracts in ``.importlinter`` hold it.
"""
