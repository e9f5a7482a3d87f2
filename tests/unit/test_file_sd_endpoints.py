"""The exporters' Prometheus file_sd file as the direct source's endpoint list
(gpumon.wire.file_sd, FileEndpoints): what the file may hold, and how its reader keeps going
through a file that is missing, half-written or wrong."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from gpumon.controller.shell.signal_sources.endpoints import FileEndpoints
from gpumon.wire import file_sd

pytestmark = pytest.mark.unit


def urls(raw: bytes, *, yaml_format: bool = False, scheme: str = "http") -> dict[str, str]:
    return file_sd.exporter_urls(
        file_sd.parse(raw, yaml_format=yaml_format), node_label="node", scheme=scheme
    )


def test_a_group_per_exporter_names_its_node_and_its_scheme() -> None:
    raw = json.dumps(
        [
            {"targets": ["10.0.0.1:9842"], "labels": {"node": "a"}},
            {"targets": ["[fd00::2]:9842"], "labels": {"node": "b", "__scheme__": "https"}},
        ]
    ).encode()
    assert urls(raw) == {"a": "http://10.0.0.1:9842", "b": "https://[fd00::2]:9842"}


def test_yaml_as_prometheus_reads_it_and_an_empty_file_lists_none() -> None:
    assert urls(b"- targets: ['h:1']\n  labels: {node: a}\n", yaml_format=True) == {"a": "http://h:1"}
    assert urls(b"", yaml_format=True) == {}
    assert urls(b"[]") == {}


def test_dump_is_what_parse_reads_back() -> None:
    assert urls(file_sd.dump({"b": "127.0.0.1:2", "a": "127.0.0.1:1"})) == {
        "a": "http://127.0.0.1:1",
        "b": "http://127.0.0.1:2",
    }


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"targets": ["h:1"]}], "0.labels: no 'node' label"),
        ([{"targets": ["h:1", "h:2"], "labels": {"node": "a"}}], "0.targets: 2 targets for node a"),
        ([{"targets": [], "labels": {"node": "a"}}], "0.targets: 0 targets"),
        ([{"targets": ["h"], "labels": {"node": "a"}}], "0.targets.0: 'h' is not host:port"),
        ([{"targets": ["h:99999"], "labels": {"node": "a"}}], "is not host:port"),
        ([{"targets": ["h:1/metrics"], "labels": {"node": "a"}}], "is not host:port"),
        ([{"targets": ["h:1"], "labels": {"node": "a", "__scheme__": "ftp"}}], "'ftp', not http or https"),
        (
            [{"targets": ["h:1"], "labels": {"node": "a"}}, {"targets": ["h:2"], "labels": {"node": "a"}}],
            "1.labels.node: node a is in an earlier group too",
        ),
        ([{"targets": [1], "labels": {"node": "a"}}], "0.targets.0"),
        ([{"targets": ["h:1"], "labels": {"node": "a"}, "extra": 1}], "0.extra"),
        ({"targets": ["h:1"]}, "a list of {targets"),
    ],
)
def test_each_broken_rule_is_named(groups: object, message: str) -> None:
    with pytest.raises(file_sd.FileSdError, match=None) as e:
        urls(json.dumps(groups).encode())
    assert message in str(e.value)


def test_not_json_and_too_big_are_refused_before_parsing() -> None:
    with pytest.raises(file_sd.FileSdError, match="not JSON"):
        urls(b'[{"targets": ')
    with pytest.raises(file_sd.FileSdError, match="over the"):
        urls(b" " * (file_sd.MAX_FILE_BYTES + 1))


class Errors(list[str]):
    def __call__(self, kind: str) -> None:
        self.append(kind)


def endpoints(path: Path, errors: Errors) -> FileEndpoints:
    return FileEndpoints(path, node_label="node", scheme="http", refresh_seconds=1, on_error=errors)


def write(path: Path, body: bytes, *, mtime_ns: int) -> None:
    # Replaced whole, as a writer should; the mtime is set so that two writes within the
    # filesystem's timestamp granularity still differ.
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(body)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    tmp.replace(path)


async def test_the_map_follows_the_file_and_changed_is_set_only_when_it_changes(tmp_path: Path) -> None:
    path, errors = tmp_path / "targets.json", Errors()
    e = endpoints(path, errors)
    write(path, file_sd.dump({"a": "127.0.0.1:1"}), mtime_ns=1)
    e.refresh()
    assert e.current() == {"a": "http://127.0.0.1:1"} and e.changed.is_set()
    e.changed.clear()
    write(path, file_sd.dump({"a": "127.0.0.1:1"}), mtime_ns=2)  # touched, same exporters
    e.refresh()
    assert not e.changed.is_set()
    write(path, file_sd.dump({"a": "127.0.0.1:1", "b": "127.0.0.1:2"}), mtime_ns=3)
    e.refresh()
    assert set(e.current()) == {"a", "b"} and e.changed.is_set()
    assert errors == []


async def test_a_missing_or_refused_file_keeps_the_last_map_is_counted_and_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, errors = tmp_path / "targets.json", Errors()
    e = endpoints(path, errors)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        e.refresh()  # looked for at every refresh, told once
    assert e.current() == {} and errors == ["targets_file_missing"] * 3
    assert len(caplog.records) == 1
    write(path, file_sd.dump({"a": "127.0.0.1:1"}), mtime_ns=1)
    e.refresh()
    assert e.current() == {"a": "http://127.0.0.1:1"}
    caplog.clear()
    write(path, b'[{"targets": ["h:1"]', mtime_ns=2)
    for _ in range(3):
        e.refresh()  # the same bad file: read once, told once
    assert e.current() == {"a": "http://127.0.0.1:1"}
    assert errors == ["targets_file_missing"] * 3 + ["targets_file_invalid"]
    assert [r.getMessage() for r in caplog.records] == [
        "exporter targets file refused; the last accepted exporters stay"
    ]
    write(path, file_sd.dump({"b": "127.0.0.1:2"}), mtime_ns=3)
    e.refresh()
    assert e.current() == {"b": "http://127.0.0.1:2"}


def test_gpumon_status_reads_the_same_file_and_names_it_when_it_cannot(tmp_path: Path) -> None:
    from gpumon.config.controller import DirectSignalsConfig
    from gpumon.status.command import TargetsFileError, exporter_endpoints

    path = tmp_path / "targets.yaml"
    path.write_text("- targets: ['127.0.0.1:1']\n  labels: {node: a}\n")
    assert exporter_endpoints(DirectSignalsConfig(targets_file=path)) == {"a": "http://127.0.0.1:1"}
    assert exporter_endpoints(DirectSignalsConfig(endpoints={"b": "http://h:2"})) == {"b": "http://h:2"}
    with pytest.raises(TargetsFileError, match=r"targets_file .*gone\.json"):
        exporter_endpoints(DirectSignalsConfig(targets_file=tmp_path / "gone.json"))
