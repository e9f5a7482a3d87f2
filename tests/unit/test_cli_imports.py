"""``gpumon exporter`` builds only its own command's parser: a process keeps every module it
imported, and the exporter runs on every GPU node (bench/RESULTS.md, "Exporter footprint")."""

from __future__ import annotations

import subprocess
import sys

# Modules only the other commands import: the test cluster's PKI (cryptography), the demo, the
# controller. The exporter's flags need none of them.
_NOT_FOR_THE_EXPORTER = (
    "gpumon.devcluster",
    "gpumon.demo",
    "gpumon.controller",
    "cryptography",
    "kubernetes_asyncio",
)


def test_the_exporters_parser_imports_no_other_command() -> None:
    probe = (
        "import sys\n"
        "from gpumon import cli\n"
        "try:\n"
        "    cli.main(['exporter', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({_NOT_FOR_THE_EXPORTER!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_help_still_lists_every_command() -> None:
    from gpumon import cli

    parser = cli.build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert set(cli.COMMANDS) <= set(choices)
    assert cli.main(["version"]) == 0
