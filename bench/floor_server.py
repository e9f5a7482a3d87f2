"""The floor under the exporter's memory: a server with no gpumon code, only what gpumon's exporter
cannot do without on a node (the interpreter, asyncio, aiohttp's server, nvidia-ml-py and the
opened NVML library), doing the least of the exporter's work: every second, in a worker thread,
it reads each GPU's memory, utilization, temperature, power and processes, and serves those
numbers at ``/metrics``. ``python -m bench.floor_server PORT``; :mod:`bench.memory` runs it.

It imports nothing of gpumon's (nor PyYAML, pydantic or prometheus_client), so its resident
memory is what 48 MiB has to hold besides gpumon's own code and data.
"""

from __future__ import annotations

import asyncio
import sys

import pynvml
from aiohttp import web


def _read(handles: list[object]) -> bytes:
    lines = []
    for i, h in enumerate(handles):
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        power = pynvml.nvmlDeviceGetPowerUsage(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        used = sum(p.usedGpuMemory or 0 for p in procs)
        lines.append(f'gpu{{gpu="{i}"}} {mem.used} {util.gpu} {temp} {power} {len(procs)} {used}')
    return ("\n".join(lines) + "\n").encode()


async def _serve(port: int) -> None:
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    body = await asyncio.to_thread(_read, handles)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    while True:
        await asyncio.sleep(1)
        body = await asyncio.to_thread(_read, handles)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
