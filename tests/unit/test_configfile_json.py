"""gpumon.config.files reads a YAML document that is plain JSON with :mod:`json`, so a process whose
only file is such a document (the exporter, as the Helm chart configures it) never imports yaml;
anything JSON and YAML would read differently goes to YAML's parser and its messages."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from gpumon.config.files import ConfigError, parse_yaml

SAME_EITHER_WAY = [
    '{"port": 9842, "pods": {"enabled": true, "resource_names": ["nvidia.com/gpu"]}}',
    '{"health": {"xid_overrides": {"79": "healthy"}}, "log": {"format": "json"}}',
    '  {"a": null, "b": -1.5, "c": "\\u00e9t\\u00e9", "d": [1, [2, {}]]}\n',
    "[]",
    '"text"',
    "12",
]


@pytest.mark.parametrize("text", SAME_EITHER_WAY)
def test_a_json_document_reads_as_yaml_reads_it(text: str) -> None:
    assert parse_yaml(text, "test") == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"port": 1,\n "port": 2}', "duplicate key 'port' (first at line 1)"),
        ('{"port": 1, "log": {"format": "json", "format": "text"}}', "duplicate key 'format'"),
        ('{"port": [1,', "is not valid YAML at line 1"),
    ],
)
def test_json_yaml_would_refuse_gets_yamls_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_yaml(text, "config file x")
    assert message in str(e.value)


def test_what_json_and_yaml_read_differently_is_read_as_yaml() -> None:
    assert parse_yaml('{"t": NaN}', "test") == {"t": "NaN"}  # YAML 1.1: not a number
    assert parse_yaml("port: 9842\n", "test") == {"port": 9842}
    assert parse_yaml("", "test") is None


def test_reading_a_json_document_imports_no_yaml() -> None:
    probe = (
        "import sys\n"
        "from gpumon.config.files import parse_yaml\n"
        "assert parse_yaml('{\"port\": 1}', 'test') == {'port': 1}\n"
        "print('yaml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
