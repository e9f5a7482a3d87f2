"""gpumon's one quantity grammar (gpumon/k8s/resources.py) against Kubernetes' own parser.

A small Go program runs k8s.io/apimachinery's ``Quantity.UnmarshalJSON`` (the API server's
decoder), at the version the local control plane is built from (hack/tools/kubernetes), from the
local module cache with the proxy off, over the table of tests/kubernetes_quantities.py and every
string of up to four characters from the grammar's alphabet plus random longer ones. Each
must get the same answer from both, except the refusals gpumon makes on purpose."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

from kubernetes_quantities import KUBERNETES, REFUSED_ON_PURPOSE

from gpumon.k8s.resources import quantity

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_TOOLS = ROOT / "hack" / "tools" / "kubernetes"

_PROBE = """package main

import (
	"bufio"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var q resource.Quantity
		if err := q.UnmarshalJSON(in.Bytes()); err != nil {
			fmt.Println("refused")
			continue
		}
		fmt.Println(q.AsDec().String())
	}
}
"""
_ALPHABET = "0129.+-eEKMGTPiumnk "
# ParseQuantity caps a binary SI quantity at 2^63 - 1, where gpumon refuses one beyond it.
_LARGEST = Decimal(2**63 - 1)


def _apimachinery_version() -> str:
    out = subprocess.run(
        ["go", "mod", "edit", "-json"], cwd=KUBERNETES_TOOLS, capture_output=True, text=True, check=True
    )
    doc = json.loads(out.stdout)
    return next(r["New"]["Version"] for r in doc["Replace"] if r["Old"]["Path"] == "k8s.io/apimachinery")


def _kubernetes_verdicts(texts: list[str], scratch: Path) -> list[Decimal | None]:
    (scratch / "go.mod").write_text(
        f"module quantityprobe\n\ngo 1.26.0\n\nrequire k8s.io/apimachinery {_apimachinery_version()}\n"
    )
    shutil.copy(KUBERNETES_TOOLS / "go.sum", scratch / "go.sum")
    (scratch / "main.go").write_text(_PROBE)
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOSUMDB": "off"}
    tidy = subprocess.run(
        ["go", "mod", "tidy"], cwd=scratch, env=env, capture_output=True, text=True, timeout=300
    )
    assert tidy.returncode == 0, f"apimachinery is not in the module cache:\n{tidy.stderr[-2000:]}"
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    run = subprocess.run(
        ["go", "run", "."], cwd=scratch, env=env, input=lines, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    answers = run.stdout.splitlines()
    assert len(answers) == len(texts)
    return [None if a == "refused" else Decimal(a) for a in answers]


def _corpus() -> list[str]:
    short = ("".join(t) for n in range(1, 5) for t in itertools.product(_ALPHABET, repeat=n))
    rnd = random.Random(30)
    longer = ("".join(rnd.choices(_ALPHABET + "345678", k=rnd.randint(5, 14))) for _ in range(20_000))
    # ParseQuantity takes minutes over an exponent past an int32 (it wraps), so none is asked.
    on_purpose = {t for t, _ in REFUSED_ON_PURPOSE}
    return sorted({*short, *longer, *(t for t, _ in KUBERNETES)} - on_purpose)


def _refused_on_purpose(text: str, kubernetes: Decimal) -> bool:
    """What ParseQuantity reads and gpumon refuses (resources.py says why): no digit in the
    number, or a magnitude beyond 2^63 - 1."""
    number = text.strip().lstrip("+-")
    no_digit = not number[:1].isdigit() and not (number[:1] == "." and number[1:2].isdigit())
    return no_digit or abs(kubernetes) >= _LARGEST


def test_every_string_gets_kubernetes_answer(tmp_path: Path) -> None:
    texts = _corpus()
    differences = [
        (text, str(theirs), str(ours))
        for text, theirs in zip(texts, _kubernetes_verdicts(texts, tmp_path), strict=True)
        if (ours := quantity(text)) != theirs
        and not (ours is None and theirs is not None and _refused_on_purpose(text, theirs))
    ]
    assert differences == [], f"{len(differences)} of {len(texts)} differ, e.g. {differences[:20]}"


def test_the_unit_table_is_kubernetes_own(tmp_path: Path) -> None:
    texts = [t for t, _ in KUBERNETES] + [t for t, k in REFUSED_ON_PURPOSE if k[:1].isdigit()]
    recorded = [None if v is None else Decimal(v) for _, v in KUBERNETES]
    recorded += [Decimal(k) for _, k in REFUSED_ON_PURPOSE if k[:1].isdigit()]
    assert _kubernetes_verdicts(texts, tmp_path) == recorded
