"""A corpus of bad input: every case must end in exit code 2, one message naming the field (and
the file, where there is one) and no traceback.

Config files, rules files, scenario files, kubeconfigs, TLS and token files, flags and
environment variables, for both `gpumon exporter` and `gpumon controller`. Most cases run
``gpumon.cli.main`` in-process; :data:`SUBPROCESS_CASES` (one per kind of failure) run the
installed ``gpumon`` entry point, so the exit code and stderr are the real ones.

Nothing here may serve: every case passes a loopback address (the flags, or the file when the
case is about the address or port), and in-process ``aiohttp.web.AppRunner`` is a tripwire, so
input that is wrongly accepted fails the case at once instead of running.
"""

from __future__ import annotations

import datetime as dt
import enum
import gc
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpumon.cli import main
from gpumon.config.files import MAX_FILE_BYTES

pytestmark = pytest.mark.timeout(60)


class Special(enum.Enum):
    """File contents made at run time."""

    FIFO = "fifo"
    DIRECTORY = "directory"
    OVERSIZED = "oversized"  # valid YAML (a comment) one byte over the limit
    CERT = "cert"
    KEY = "key"
    OTHER_KEY = "other key"
    ENCRYPTED_KEY = "encrypted key"
    ENCRYPTED_CERT = "cert of the encrypted key"
    KUBECONFIG = "a valid kubeconfig whose API server (127.0.0.1:1) refuses connections"


Content = bytes | Special

LOOPBACK = ("--listen-address", "127.0.0.1", "--port", "0")


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # exporter | controller
    argv: tuple[str, ...]
    # Substrings of the message; "{tmp}" is the case's directory, "{busy}" a port in use.
    expect: tuple[str, ...]
    files: Mapping[str, Content] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    loopback_flags: bool = True  # False: the case sets the address or port itself

    def full_argv(self) -> list[str]:
        base: tuple[str, ...] = ()
        if self.command == "exporter":
            base = ("--backend", "simulated")
        elif "--kubeconfig" not in self.argv and not any(k.endswith("KUBECONFIG") for k in self.env):
            base = ("--kubeconfig", "{tmp}/kubeconfig")
        return [*base, *(LOOPBACK if self.loopback_flags else ()), *self.argv]

    def all_files(self) -> Mapping[str, Content]:
        if self.command == "controller" and "kubeconfig" not in self.files:
            return {"kubeconfig": Special.KUBECONFIG, **self.files}
        return self.files


def y(text: str) -> bytes:
    return text.encode()


def exporter(id: str, argv: tuple[str, ...], expect: tuple[str, ...], **kw: object) -> Case:
    return Case(id, "exporter", argv, expect, **kw)  # type: ignore[arg-type]


def controller(id: str, argv: tuple[str, ...], expect: tuple[str, ...], **kw: object) -> Case:
    return Case(id, "controller", argv, expect, **kw)  # type: ignore[arg-type]


C = "{tmp}/c.yaml"
LATIN1 = "caf\xe9".encode("latin-1")


def exporter_config(id: str, content: Content, *expect: str, loopback_flags: bool = True) -> Case:
    return exporter(id, ("--config", C), expect, files={"c.yaml": content}, loopback_flags=loopback_flags)


def nested_yaml(key_path: str, yaml_value: str) -> str:
    """``a.b: value`` as YAML text: one mapping level per dotted part."""
    *parents, leaf = key_path.split(".")
    text = "".join("  " * depth + f"{p}:\n" for depth, p in enumerate(parents))
    return text + "  " * len(parents) + f"{leaf}: {yaml_value}\n"


def exporter_file_value(key_path: str, yaml_value: str) -> Case:
    """``a.b: value`` in the exporter's file, with the address on loopback (the file is the source)."""
    return exporter_config(
        f"exporter-{key_path}-{yaml_value}",
        y("listen_address: 127.0.0.1\n" + nested_yaml(key_path, yaml_value)),
        f"{key_path}: Input should be a number, not a boolean",
        C,
        loopback_flags=key_path not in ("port", "listen_address"),
    )


def controller_config(id: str, content: Content, *expect: str) -> Case:
    return controller(id, ("--config", C), expect, files={"c.yaml": content})


def controller_file_value(key_path: str, yaml_value: str, expect_field: str | None = None) -> Case:
    return controller_config(
        f"controller-{key_path}-{yaml_value}",
        y(nested_yaml(key_path, yaml_value)),
        f"{expect_field or key_path}: Input should be a number, not a boolean",
        f"from config file {C}",
    )


SCENARIO = "{tmp}/s.yaml"


def scenario(id: str, content: Content | None, *expect: str) -> Case:
    files = {"s.yaml": content} if content is not None else {}
    return exporter(f"scenario-{id}", ("--scenario", SCENARIO), ("simulation.scenario", *expect), files=files)


RULES = "{tmp}/r.yaml"
RULE = "rules:\n  - name: gpu-hot\n    signal: temperature\n    severity: degraded\n"


def rules(id: str, content: Content, *expect: str) -> Case:
    return controller(f"rules-{id}", ("--rules", RULES), expect, files={"r.yaml": content})


KUBECONFIG = "{tmp}/k.yaml"


def kubeconfig(id: str, content: Content | None, *expect: str) -> Case:
    files = {"k.yaml": content} if content is not None else {}
    return controller(
        f"kubeconfig-{id}", ("--kubeconfig", KUBECONFIG), ("kubeconfig: ", *expect), files=files
    )


def tls(id: str, cert: Content | None, key: Content | None, *expect: str) -> Case:
    files = {name: c for name, c in (("cert.pem", cert), ("key.pem", key)) if c is not None}
    argv = ("--tls-cert-file", "{tmp}/cert.pem", "--tls-key-file", "{tmp}/key.pem")
    return exporter(f"tls-{id}", argv, expect, files=files)


GOOD_KUBECONFIG_TAIL = (
    "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\n"
)

CASES: list[Case] = [
    # -- exporter config file: encoding, duplicate keys, what kind of file --------------------------
    exporter_config(
        "exporter-config-latin1", y("node_name: ") + LATIN1 + b"\n", "config file", C, "not UTF-8"
    ),
    exporter_config("exporter-config-latin1-comment", b"# \xff\xfe\nport: 1\n", "not UTF-8", C, "line 1"),
    exporter_config("exporter-config-utf16", "port: 9842\n".encode("utf-16"), "not UTF-8", C),
    exporter_config("exporter-config-truncated-utf8", y("node_name: x\n") + b"\xe2\x82", "not UTF-8", C),
    exporter_config(
        "exporter-config-dup-top", y("backend: simulated\nbackend: nvml\n"), "duplicate key 'backend'", C
    ),
    exporter_config(
        "exporter-config-dup-nested",
        y("sampling:\n  fast_interval_seconds: 1\n  fast_interval_seconds: 2\n"),
        "duplicate key 'fast_interval_seconds'",
        "line 3",
        C,
    ),
    exporter_config(
        "exporter-config-dup-flow", y("log: {level: info, level: debug}\n"), "duplicate key 'level'", C
    ),
    exporter_config(
        "exporter-config-dup-section",
        y("sampling: {fast_interval_seconds: 1}\nsampling: {slow_interval_seconds: 20}\n"),
        "duplicate key 'sampling'",
        C,
    ),
    exporter_config(
        "exporter-config-dup-xid",
        y("health:\n  xid_overrides: {79: lost, 79: degraded}\n"),
        "duplicate key 79",
        C,
    ),
    exporter_config("exporter-config-fifo", Special.FIFO, "config file", C, "a FIFO, not a regular file"),
    exporter_config("exporter-config-directory", Special.DIRECTORY, "config file", C, "a directory"),
    exporter_config("exporter-config-oversized", Special.OVERSIZED, "config file", C, "larger than"),
    exporter(
        "exporter-config-dev-zero", ("--config", "/dev/zero"), ("config file /dev/zero", "character device")
    ),
    exporter(
        "exporter-config-dev-null", ("--config", "/dev/null"), ("config file /dev/null", "character device")
    ),
    exporter_config("exporter-config-top-level-list", y("- port: 1\n"), "must hold a mapping", C),
    exporter_config("exporter-config-bad-yaml", y("sampling: [\n"), "not valid YAML at line 2", C),
    exporter_config("exporter-config-nul", b"port: 1\n\x00\n", "not valid YAML", C),
    # -- exporter config: booleans where numbers belong ----------------------------------------------
    exporter_file_value("port", "true"),
    exporter_file_value("port", "false"),
    exporter_file_value("sampling.fast_interval_seconds", "true"),
    exporter_file_value("sampling.slow_interval_seconds", "yes"),
    exporter_file_value("sampling.call_timeout_seconds", "on"),
    exporter_file_value("simulation.gpus", "true"),
    exporter_file_value("simulation.seed", "false"),
    exporter_file_value("health.xid_window_seconds", "true"),
    exporter_file_value("health.temperature_degraded_celsius", "true"),
    exporter_file_value("health.temperature_unhealthy_celsius", "true"),
    exporter_file_value("pods.max_series", "true"),
    exporter_config(
        "exporter-config-xid-override-bool-key",
        y("health:\n  xid_overrides: {true: unhealthy}\n"),
        "health.xid_overrides.",
        "not a boolean",
    ),
    # -- exporter environment ----------------------------------------------------------------------
    exporter(
        "exporter-env-sampling-json-bool",
        (),
        ("sampling.fast_interval_seconds: Input should be a number, not a boolean",),
        env={"GPUMON_SAMPLING": '{"fast_interval_seconds": true}'},
    ),
    exporter(
        "exporter-env-simulation-json-bool",
        (),
        ("simulation.gpus: Input should be a number, not a boolean",),
        env={"GPUMON_SIMULATION": '{"gpus": true}'},
    ),
    exporter(
        "exporter-env-health-json-bool",
        (),
        ("health.xid_window_seconds: Input should be a number, not a boolean",),
        env={"GPUMON_HEALTH": '{"xid_window_seconds": false}'},
    ),
    exporter(
        "exporter-env-config-fifo-scenario",
        (),
        ("simulation.scenario", "{tmp}/s.yaml", "a FIFO"),
        files={"s.yaml": Special.FIFO},
        env={"GPUMON_SIMULATION__SCENARIO": "{tmp}/s.yaml"},
    ),
    exporter(
        "exporter-env-port-word",
        (),
        ("port: Input should be a valid integer", "$GPUMON_PORT"),
        env={"GPUMON_LISTEN_ADDRESS": "127.0.0.1", "GPUMON_PORT": "true"},
        loopback_flags=False,
    ),
    # -- exporter flags: where to listen ----------------------------------------------------------------
    exporter(
        "exporter-listen-address-idna",
        ("--listen-address", "x" * 64 + ".example", "--port", "0"),
        ("listen_address: cannot resolve", "x" * 64),
        loopback_flags=False,
    ),
    exporter(
        "exporter-listen-address-unresolvable",
        ("--listen-address", "no-such-host.invalid", "--port", "0"),
        ("listen_address: cannot resolve 'no-such-host.invalid'",),
        loopback_flags=False,
    ),
    exporter(
        "exporter-port-in-use",
        ("--listen-address", "127.0.0.1", "--port", "{busy}"),
        ("port: cannot listen on port {busy}", "in use"),
        loopback_flags=False,
    ),
    exporter(
        "exporter-port-in-use-from-file",
        ("--config", C),
        ("port: cannot listen on port {busy}", "in use"),
        files={"c.yaml": y("listen_address: 127.0.0.1\nport: {busy}\n")},
        loopback_flags=False,
    ),
    exporter(
        "exporter-port-in-use-from-env",
        (),
        ("port: cannot listen on port {busy}",),
        env={"GPUMON_LISTEN_ADDRESS": "127.0.0.1", "GPUMON_PORT": "{busy}"},
        loopback_flags=False,
    ),
    # -- exporter TLS --------------------------------------------------------------------------------------
    tls("key-missing", Special.CERT, None, "tls.key_file", "{tmp}/key.pem", "No such file"),
    tls("key-directory", Special.CERT, Special.DIRECTORY, "tls.key_file", "{tmp}/key.pem", "a directory"),
    tls("key-fifo", Special.CERT, Special.FIFO, "tls.key_file", "{tmp}/key.pem", "a FIFO"),
    tls("key-garbage", Special.CERT, y("not a key\n"), "tls.key_file", "{tmp}/key.pem"),
    tls("key-is-the-cert", Special.CERT, Special.CERT, "tls.key_file", "{tmp}/key.pem"),
    tls("key-of-another-cert", Special.CERT, Special.OTHER_KEY, "tls.key_file", "is not the key of"),
    tls("key-encrypted", Special.ENCRYPTED_CERT, Special.ENCRYPTED_KEY, "tls.key_file", "encrypted"),
    tls("key-empty", Special.CERT, b"", "tls.key_file", "{tmp}/key.pem"),
    tls("cert-missing", None, Special.KEY, "tls.cert_file", "{tmp}/cert.pem", "No such file"),
    tls("cert-garbage", y("not a cert\n"), Special.KEY, "tls.cert_file", "{tmp}/cert.pem"),
    tls("cert-is-the-key", Special.KEY, Special.KEY, "tls.cert_file", "{tmp}/cert.pem"),
    tls("cert-fifo", Special.FIFO, Special.KEY, "tls.cert_file", "a FIFO"),
    # -- exporter bearer token ------------------------------------------------------------------------
    exporter(
        "exporter-token-fifo",
        ("--bearer-token-file", "{tmp}/token"),
        ("auth.bearer_token_file", "{tmp}/token", "a FIFO"),
        files={"token": Special.FIFO},
    ),
    exporter(
        "exporter-token-dev-zero",
        ("--bearer-token-file", "/dev/zero"),
        ("auth.bearer_token_file", "/dev/zero", "character device"),
    ),
    # -- scenario files --------------------------------------------------------------------------------
    scenario("latin1", y("faults: [{at: 1, gpu: 0, fault: lost}]  # ") + LATIN1, SCENARIO, "not UTF-8"),
    scenario(
        "dup-in-fault",
        y("faults:\n  - {at: 1, at: 5, gpu: 0, fault: lost}\n"),
        "duplicate key 'at'",
        SCENARIO,
    ),
    scenario(
        "dup-top",
        y("faults: [{at: 1, gpu: 0, fault: lost}]\nfaults: [{at: 2, gpu: 1, fault: clear}]\n"),
        "duplicate key 'faults'",
        SCENARIO,
    ),
    scenario(
        "dup-in-process",
        y("processes:\n  - gpu: 0\n    pid: 1\n    pid: 2\n    used_memory_mib: 1\n    sm_share: 0.1\n"),
        "duplicate key 'pid'",
        "line 4",
    ),
    scenario("gpu-bool", y("faults: [{at: 1, gpu: true, fault: lost}]\n"), "gpu", "not a boolean", SCENARIO),
    scenario("at-bool", y("faults: [{at: true, gpu: 0, fault: lost}]\n"), "at", "not a boolean"),
    scenario(
        "xid-code-bool", y("faults: [{at: 1, gpu: 0, fault: xid, code: true}]\n"), "code", "not a boolean"
    ),
    scenario(
        "celsius-bool",
        y("faults: [{at: 1, gpu: 0, fault: overheat, celsius: true}]\n"),
        "celsius",
        "not a boolean",
    ),
    scenario(
        "ecc-count-bool", y("faults: [{at: 1, gpu: 0, fault: ecc, count: true}]\n"), "count", "not a boolean"
    ),
    scenario(
        "process-pid-bool",
        y("processes: [{gpu: 0, pid: true, used_memory_mib: 1, sm_share: 0.5}]\n"),
        "pid",
        "not a boolean",
    ),
    scenario(
        "process-share-bool",
        y("processes: [{gpu: 0, pid: 7, used_memory_mib: 1, sm_share: true}]\n"),
        "sm_share",
        "not a boolean",
    ),
    scenario("mig-gpu-bool", y("mig: [{gpu: true, profiles: [3g.40gb]}]\n"), "gpu", "not a boolean"),
    scenario("fifo", Special.FIFO, SCENARIO, "a FIFO"),
    scenario("directory", Special.DIRECTORY, SCENARIO, "a directory"),
    scenario("oversized", Special.OVERSIZED, SCENARIO, "larger than"),
    exporter(
        "scenario-dev-zero",
        ("--scenario", "/dev/zero"),
        ("simulation.scenario", "/dev/zero", "character device"),
    ),
    scenario("bad-yaml", y("faults: [\n"), SCENARIO, "not valid YAML"),
    scenario("missing", None, "cannot read scenario file", SCENARIO, "No such file"),
    # -- rules files ---------------------------------------------------------------------------------------
    rules(
        "latin1", y(RULE + "    threshold: 90  # ") + LATIN1 + b"\n", "policy.rules_file", RULES, "not UTF-8"
    ),
    rules(
        "dup-threshold",
        y(RULE + "    threshold: 90\n    threshold: 95\n"),
        "policy.rules_file",
        RULES,
        "duplicate key 'threshold'",
        "line 6",
    ),
    rules("dup-rules", y("rules: []\nrules: []\n"), "policy.rules_file", "duplicate key 'rules'"),
    rules(
        "dup-selector-label",
        y(RULE + "    threshold: 90\n    nodeSelector: {a: b, a: c}\n"),
        "duplicate key 'a'",
        RULES,
    ),
    rules(
        "threshold-bool",
        y(RULE + "    threshold: true\n"),
        "'gpu-hot'",
        RULES,
        "threshold: Input should be a number, not a boolean",
    ),
    rules(
        "for-bool",
        y(RULE + "    threshold: 90\n    for: true\n"),
        "'gpu-hot'",
        "for: Input should be a number, not a boolean",
    ),
    rules(
        "recover-after-bool",
        y(RULE + "    threshold: 90\n    recoverAfter: yes\n"),
        "'gpu-hot'",
        "recoverAfter: Input should be a number",
    ),
    rules(
        "xids-bool",
        y("rules:\n  - {name: xid-79, signal: xid, severity: unhealthy, xids: [true]}\n"),
        "'xid-79'",
        "xids.0",
        "not a boolean",
    ),
    rules("fifo", Special.FIFO, "policy.rules_file", RULES, "a FIFO"),
    rules("directory", Special.DIRECTORY, "policy.rules_file", RULES, "a directory"),
    rules("oversized", Special.OVERSIZED, "policy.rules_file", RULES, "larger than"),
    rules("bad-yaml", y("rules:\n  - name: [\n"), "policy.rules_file", RULES, "not valid YAML"),
    controller(
        "rules-dev-zero", ("--rules", "/dev/zero"), ("policy.rules_file", "/dev/zero", "character device")
    ),
    controller("rules-missing", ("--rules", RULES), ("policy.rules_file", "cannot read rules file", RULES)),
    # -- controller config file ------------------------------------------------------------------------
    controller_config(
        "controller-config-latin1", y("namespace: ") + LATIN1 + b"\n", "config file", C, "not UTF-8"
    ),
    controller_config(
        "controller-config-dup-dry-run", y("dry_run: true\ndry_run: false\n"), "duplicate key 'dry_run'", C
    ),
    controller_config(
        "controller-config-dup-pool",
        y("pools:\n  - name: a\n    name: b\n"),
        "duplicate key 'name'",
        "line 3",
        C,
    ),
    controller_config("controller-config-fifo", Special.FIFO, "config file", C, "a FIFO"),
    controller_config("controller-config-oversized", Special.OVERSIZED, "config file", C, "larger than"),
    controller(
        "controller-config-dev-zero", ("--config", "/dev/zero"), ("config file /dev/zero", "character device")
    ),
    controller_file_value("signals.interval_seconds", "true"),
    controller_file_value("signals.stale_after_seconds", "true"),
    controller_file_value("signals.direct.port", "true"),
    controller_file_value("signals.direct.max_concurrency", "true"),
    controller_file_value("signals.direct.lines_per_second", "true"),
    controller_file_value("signals.direct.line_burst", "true"),
    controller_config(
        "controller-flood-rate-zero",
        y("signals:\n  direct:\n    lines_per_second: 0\n"),
        "signals.direct.lines_per_second: Input should be greater than 0",
        f"from config file {C}",
    ),
    controller_config(
        "controller-endpoints-and-targets-file",
        y('signals:\n  direct:\n    endpoints: {n: "http://127.0.0.1:1"}\n    targets_file: /t.json\n'),
        "targets_file: give endpoints or targets_file, not both",
        f"from config file {C}",
    ),
    controller_config(
        "controller-heartbeat-not-before-stale",
        y("signals:\n  source: direct\n  stale_after_seconds: 30\n  direct:\n    heartbeat_seconds: 30\n"),
        "signals: direct.heartbeat_seconds: 30 is not less than stale_after_seconds (30)",
        f"from config file {C}",
    ),
    controller_file_value("signals.direct.targets_refresh_seconds", "true"),
    controller_file_value("signals.prometheus.retries", "true"),
    controller_file_value("leader.lease_duration_seconds", "true"),
    controller_file_value("breaker.max_fraction", "true"),
    controller_file_value("breaker.min_nodes", "true"),
    controller_file_value("rate_limit.max_quarantines", "true"),
    controller_file_value("policy.flap_max_onsets", "true"),
    controller_file_value("policy.recover_after_seconds", "true"),
    controller_file_value("drain.deadline_seconds", "true"),
    controller(
        "controller-config-port-bool",
        ("--config", C),
        ("port: Input should be a number, not a boolean", f"from config file {C}"),
        files={"c.yaml": y("listen_address: 127.0.0.1\nport: true\n")},
        loopback_flags=False,
    ),
    controller_config(
        "controller-config-pool-max-replicas-bool",
        y(
            "pools:\n  - name: a\n    target: {namespace: n, name: md}\n    node_selector: pool=a\n"
            "    template: {resources: {nvidia.com/gpu: 8}}\n    max_replicas: true\n"
        ),
        "pools.0.max_replicas: Input should be a number, not a boolean",
        f"from config file {C}",
    ),
    controller_config(
        "controller-config-pool-gpu-resource-bool",
        y(
            "pools:\n  - name: a\n    target: {namespace: n, name: md}\n    node_selector: pool=a\n"
            "    template: {resources: {nvidia.com/gpu: true}}\n    max_replicas: 3\n"
        ),
        "pools.0.template.resources.nvidia.com/gpu: Input should be a number, not a boolean",
        f"from config file {C}",
    ),
    controller_config(
        "controller-config-pool-repair-template-without-image",
        y(
            "pools:\n  - name: a\n    target: {namespace: n, name: md}\n    node_selector: pool=a\n"
            "    template: {resources: {nvidia.com/gpu: 8}}\n    max_replicas: 3\n"
            "    repair:\n      steps: [reboot]\n"
            "      reboot_job: {template: {spec: {containers: [{name: reboot}]}}}\n"
        ),
        "pools.0.repair.reboot_job.template: spec.containers.0: needs a name and an image",
        f"from config file {C}",
    ),
    controller_config(
        "controller-config-inline-rule-threshold-bool",
        y("policy:\n  rules:\n    - {name: hot, signal: temperature, severity: degraded, threshold: true}\n"),
        "'hot'",
        "policy.rules[0]",
        "threshold: Input should be a number, not a boolean",
    ),
    controller_config(
        "controller-config-builtin-thermal-threshold",
        y("policy:\n  rules:\n    - {name: thermal-degraded, threshold: 85}\n"),
        "'thermal-degraded'",
        "policy.rules[0]",
        "threshold: a built-in rule judges a GPU as the exporters do, from policy.health",
    ),
    controller(
        "controller-config-token-fifo",
        ("--config", C),
        ("signals.prometheus.bearer_token_file", "{tmp}/token", "a FIFO"),
        files={
            "c.yaml": y("signals:\n  prometheus:\n    bearer_token_file: {tmp}/token\n"),
            "token": Special.FIFO,
        },
    ),
    controller(
        "controller-env-leader-json-bool",
        (),
        ("leader.lease_duration_seconds: Input should be a number, not a boolean",),
        env={"GPUMON_LEADER": '{"lease_duration_seconds": true}'},
    ),
    controller(
        "controller-env-direct-token-directory",
        (),
        ("signals.direct.bearer_token_file", "{tmp}"),
        env={"GPUMON_SIGNALS__SOURCE": "direct", "GPUMON_SIGNALS__DIRECT__BEARER_TOKEN_FILE": "{tmp}"},
    ),
    # -- controller flags: where to listen ------------------------------------------------------------
    controller(
        "controller-listen-address-idna",
        ("--listen-address", "y" * 64 + ".example", "--port", "0"),
        ("listen_address: cannot resolve",),
        loopback_flags=False,
    ),
    controller(
        "controller-port-in-use",
        ("--listen-address", "127.0.0.1", "--port", "{busy}"),
        ("port: cannot listen on port {busy}", "in use"),
        loopback_flags=False,
    ),
    # -- kubeconfig ---------------------------------------------------------------------------------------
    kubeconfig("missing", None, KUBECONFIG, "No such file"),
    kubeconfig("empty", b"", KUBECONFIG, "is empty"),
    kubeconfig("comment-only", y("# nothing here\n"), KUBECONFIG, "is empty"),
    kubeconfig("garbage", y("this is: [not a kubeconfig\n"), KUBECONFIG, "not valid YAML"),
    kubeconfig("string", y("just a string\n"), KUBECONFIG, "must hold a mapping"),
    kubeconfig("list", y("- a\n- b\n"), KUBECONFIG, "must hold a mapping"),
    kubeconfig("no-current-context", y("apiVersion: v1\nkind: Config\n"), KUBECONFIG, "current-context"),
    kubeconfig(
        "context-names-no-cluster",
        y(
            "current-context: x\ncontexts: [{name: x, context: {cluster: nope, user: u}}]\n"
            + GOOD_KUBECONFIG_TAIL
        ),
        KUBECONFIG,
        "nope",
    ),
    kubeconfig("clusters-not-a-list", y("current-context: x\nclusters: 5\n"), KUBECONFIG, "clusters"),
    kubeconfig("contexts-of-numbers", y("current-context: x\ncontexts: [1]\n"), KUBECONFIG, "contexts.0"),
    kubeconfig("latin1", y("current-context: ") + LATIN1 + b"\n", KUBECONFIG, "not UTF-8"),
    kubeconfig(
        "dup-key",
        y("current-context: x\ncurrent-context: y\n"),
        KUBECONFIG,
        "duplicate key 'current-context'",
    ),
    kubeconfig("fifo", Special.FIFO, KUBECONFIG, "a FIFO"),
    kubeconfig("directory", Special.DIRECTORY, KUBECONFIG, "a directory"),
    controller(
        "kubeconfig-from-env-missing",
        (),
        ("kubeconfig: ", "{tmp}/missing", "No such file"),
        env={"GPUMON_KUBECONFIG": "{tmp}/missing"},
    ),
    controller(
        "kubeconfig-default-missing",
        (),
        ("kubeconfig: not in a cluster", "{tmp}/absent", "No such file"),
        env={"KUBECONFIG": "{tmp}/absent"},
    ),
]

# One per kind of failure, through the installed entry point.
SUBPROCESS_CASES = [
    "exporter-config-latin1",
    "rules-latin1",
    "kubeconfig-missing",
    "kubeconfig-garbage",
    "kubeconfig-empty",
    "kubeconfig-default-missing",
    "exporter-listen-address-unresolvable",
    "exporter-port-in-use",
    "controller-port-in-use",
    "exporter-port-true",
    "exporter-config-dup-top",
    "rules-dup-threshold",
    "exporter-config-fifo",
    "tls-key-missing",
]


def _by_id() -> dict[str, Case]:
    out: dict[str, Case] = {}
    for case in CASES:
        assert case.id not in out, f"two cases named {case.id}"
        out[case.id] = case
    return out


BY_ID = _by_id()


# ---------------------------------------------------------------------------------------------
# Running a case


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[Special, bytes]:
    def pair(cn: str, encrypt: bool = False) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256())
        )
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(b"secret") if encrypt else serialization.NoEncryption()
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        return cert.public_bytes(serialization.Encoding.PEM), key_pem

    cert, key = pair("gpumon")
    _, other_key = pair("other")
    enc_cert, enc_key = pair("encrypted", encrypt=True)
    return {
        Special.CERT: cert,
        Special.KEY: key,
        Special.OTHER_KEY: other_key,
        Special.ENCRYPTED_CERT: enc_cert,
        Special.ENCRYPTED_KEY: enc_key,
    }


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port with a listener on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _fill(text: str, tmp: Path, busy: int) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{busy}", str(busy))


def _materialise(case: Case, tmp: Path, busy: int, pem: Mapping[Special, bytes]) -> None:
    for name, content in case.all_files().items():
        path = tmp / name
        if content is Special.FIFO:
            os.mkfifo(path)
        elif content is Special.DIRECTORY:
            path.mkdir()
        elif content is Special.OVERSIZED:
            path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
        elif content is Special.KUBECONFIG:
            path.write_text(
                "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
                + GOOD_KUBECONFIG_TAIL
            )
        elif isinstance(content, Special):
            path.write_bytes(pem[content])
        else:
            path.write_bytes(
                _fill(content.decode("utf-8", "surrogateescape"), tmp, busy).encode(
                    "utf-8", "surrogateescape"
                )
            )


def _check(case: Case, code: int, err: str, tmp: Path, busy: int) -> None:
    assert "Traceback" not in err, err
    assert code == 2, err
    message = err.strip()
    assert message.startswith(f"gpumon {case.command}: "), f"something came before the message:\n{err}"
    assert len(message.splitlines()) <= 4, f"one message, not a dump:\n{err}"
    for part in case.expect:
        assert _fill(part, tmp, busy) in message, f"{part!r} not in:\n{err}"


class Accepted(AssertionError):
    def __init__(self) -> None:
        super().__init__("the configuration was accepted: the app was about to start")


def _tripwire(*args: object, **kwargs: object) -> None:
    raise Accepted


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_in_process(
    case: Case,
    tmp_path: Path,
    busy_port: int,
    pem: Mapping[Special, bytes],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in list(os.environ):
        if name.startswith(("GPUMON_", "KUBERNETES_")) or name == "KUBECONFIG":
            monkeypatch.delenv(name)
    for name, value in case.env.items():
        monkeypatch.setenv(name, _fill(value, tmp_path, busy_port))
    monkeypatch.setattr("aiohttp.web.AppRunner", _tripwire)
    _materialise(case, tmp_path, busy_port, pem)
    argv = [_fill(a, tmp_path, busy_port) for a in case.full_argv()]
    code, accepted = 0, False
    try:
        code = main([case.command, *argv])
    except Accepted:
        accepted = True
    if accepted:
        # Out of the except block, the built app (the controller's HTTP session) is garbage:
        # finalise it now, not later inside pytest's report, where CPython 3.11.7's ast.parse
        # fails ("AST constructor recursion depth mismatch") if a finaliser runs under it.
        gc.collect()
        pytest.fail("the configuration was accepted: the app was about to start")
    _check(case, code, capsys.readouterr().err, tmp_path, busy_port)


def _entry_point() -> list[str]:
    script = Path(sys.executable).with_name("gpumon")
    assert script.exists(), f"the gpumon entry point is not installed beside {sys.executable}"
    return [str(script)]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_input_through_the_entry_point(
    case_id: str, tmp_path: Path, busy_port: int, pem: Mapping[Special, bytes]
) -> None:
    case = BY_ID[case_id]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUMON_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    env["HOME"] = str(tmp_path)  # no ~/.kube/config of the machine's
    env.update({k: _fill(v, tmp_path, busy_port) for k, v in case.env.items()})
    _materialise(case, tmp_path, busy_port, pem)
    argv = [_fill(a, tmp_path, busy_port) for a in case.full_argv()]
    done = subprocess.run(
        [*_entry_point(), case.command, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    _check(case, done.returncode, done.stderr, tmp_path, busy_port)


def test_the_corpus_is_large_and_each_subprocess_case_exists() -> None:
    assert len(CASES) >= 90
    assert set(SUBPROCESS_CASES) <= set(BY_ID)
    assert {BY_ID[i].command for i in SUBPROCESS_CASES} == {"exporter", "controller"}
