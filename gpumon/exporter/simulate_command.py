"""``gpumon simulate``: break (and repair) simulated GPUs of a running exporter.

Talks to the exporter's ``/api/v1/faults`` endpoint, which exists only when the exporter runs
with ``--backend simulated``. A client of the exporter's API, it sits with the exporter and takes
its default address from the exporter's configuration; the simulator it drives
(:mod:`gpumon.devices.simulated`) sits below configuration and knows none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpumon.config import DEFAULT_EXPORTER_PORT

HELP = "inject faults into a running exporter's simulated GPUs, or list them"

_MODES = ("lost", "ecc", "overheat", "slow", "remap", "clear", "unavailable", "recovery_action")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fault = sub.add_parser(
        "fault", help="inject one fault", description="Inject one fault into a simulated GPU."
    )
    faults = sub.add_parser("faults", help="list active and injected faults")
    for p in (fault, faults):
        p.add_argument(
            "--exporter",
            default=f"http://localhost:{DEFAULT_EXPORTER_PORT}",
            metavar="URL",
            help="the exporter's base URL (default: %(default)s)",
        )
        p.add_argument("--bearer-token-file", type=Path, metavar="FILE", help="send this bearer token")
        p.add_argument("--ca-file", type=Path, metavar="FILE", help="CA bundle to verify an HTTPS exporter")
    fault.add_argument("--gpu", type=int, metavar="N", help="GPU index (not needed for --mode unavailable)")
    what = fault.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, metavar="CODE", help="deliver an Xid event with this code")
    what.add_argument(
        "--mode",
        choices=_MODES,
        help="lost: fell off the bus (Xid 79); ecc: uncorrectable ECC (Xid 48); overheat: thermal "
        "slowdown; slow: reads hang; remap: row remap failure (Xid 64); clear: reset the GPU "
        "(all GPUs and the driver when --gpu is left out); unavailable: the driver goes away; "
        "recovery_action: the driver asks for --recovery-action",
    )
    fault.add_argument("--celsius", type=float, help="overheat: temperature to hold")
    fault.add_argument("--seconds", type=float, help="slow: how long each read blocks")
    fault.add_argument("--count", type=int, help="ecc: number of uncorrectable errors")
    fault.add_argument(
        "--recovery-action",
        metavar="ACTION",
        help="recovery_action: none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, "
        "recover_imex_domain, bus_reset or system_reboot",
    )


def fault_request(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    """The HTTP method and JSON body for ``simulate fault`` (pure)."""
    if args.mode == "clear" and args.gpu is None:
        return "DELETE", None
    body: dict[str, Any] = (
        {"fault": "xid", "code": args.xid} if args.xid is not None else {"fault": args.mode}
    )
    if args.mode != "unavailable":
        body["gpu"] = args.gpu
    for option in ("celsius", "seconds", "count"):
        value = getattr(args, option)
        if value is not None:
            body[option] = value
    if args.recovery_action is not None:
        body["action"] = args.recovery_action
    return "POST", body


class _RequestFailed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _call(args: argparse.Namespace, method: str, body: dict[str, Any] | None) -> Any:
    import ssl
    import urllib.error
    import urllib.request

    url = args.exporter.rstrip("/") + "/api/v1/faults"
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if args.bearer_token_file is not None:
        headers["Authorization"] = "Bearer " + args.bearer_token_file.read_text().strip()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    context = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise _RequestFailed(f"{args.exporter} does not simulate GPUs (no /api/v1/faults)", 1) from None
        try:
            message = json.load(e).get("error", e.reason)
        except ValueError:
            message = e.reason
        raise _RequestFailed(f"{args.exporter} refused: {message}", 2 if e.code == 400 else 1) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise _RequestFailed(f"cannot reach {args.exporter}: {reason}", 1) from None


def _print_status(status: dict[str, Any]) -> None:
    print(f"{status['gpus']} x {status['model']}; driver {'UNAVAILABLE' if status['unavailable'] else 'up'}")
    active = status["active"]
    for gpu in range(status["gpus"]):
        print(f"  gpu {gpu}: {', '.join(active.get(str(gpu), [])) or 'healthy'}")
    if status["injected"]:
        print("injected:")
        for f in status["injected"]:
            detail = " ".join(f"{k}={v}" for k, v in f.items() if k not in ("at", "fault"))
            print(f"  {f['at']:.3f} {f['fault']} {detail}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "faults":
            _print_status(_call(args, "GET", None))
            return 0
        if args.mode not in ("clear", "unavailable") and args.gpu is None:
            print("gpumon simulate: --gpu is required for this fault", file=sys.stderr)
            return 2
        method, body = fault_request(args)
        result = _call(args, method, body)
    except _RequestFailed as e:
        print(f"gpumon simulate: {e}", file=sys.stderr)
        return e.code
    print(json.dumps(result.get("injected", result), separators=(", ", ": ")))
    return 0
