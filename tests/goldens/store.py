"""The golden files: one xz-compressed JSON document per target, and how two versions are compared.

    {"toolchain": {"llvm": "22.1.0", "libdevice_sha256": "..."},
     "libdevice_kernels": ["tutorial02/softmax", ...],
     "kernels": {"tutorial01/add": "<PTX text>", ...}}

The text depends on LLVM's version, and the kernels in `libdevice_kernels`
also on the libdevice linked in, so `toolchain` records both: a check with a
different LLVM (or libdevice) says so instead of reporting every kernel.
"""

from __future__ import annotations

import difflib
import json
import lzma
from dataclasses import dataclass, field
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
DIFF_LINES = 120        # a failing check prints at most this much of the first kernel's diff


@dataclass
class Golden:
    """The recorded text of every case for one target."""

    toolchain: dict[str, str]
    kernels: dict[str, str] = field(default_factory=dict)
    libdevice_kernels: list[str] = field(default_factory=list)


def path_for(target: str) -> Path:
    return DIRECTORY / f"{target}.json.xz"


def load(target: str) -> Golden | None:
    """The goldens of `target`, or None when none were recorded."""
    path = path_for(target)
    if not path.is_file():
        return None
    document = json.loads(lzma.decompress(path.read_bytes()))
    return Golden(document["toolchain"], document["kernels"], document["libdevice_kernels"])


def save(target: str, golden: Golden) -> Path:
    document = {"toolchain": golden.toolchain, "libdevice_kernels": sorted(golden.libdevice_kernels),
                "kernels": dict(sorted(golden.kernels.items()))}
    path = path_for(target)
    path.write_bytes(lzma.compress(json.dumps(document, indent=0).encode(), preset=9 | lzma.PRESET_EXTREME))
    return path


def comparable(recorded: Golden, toolchain: dict[str, str]) -> tuple[set[str], str | None]:
    """(the kernels whose text this toolchain can reproduce, why the others cannot; None if all can)."""
    if recorded.toolchain["llvm"] != toolchain["llvm"]:
        return set(), (f"the goldens were recorded with LLVM {recorded.toolchain['llvm']}, this is LLVM "
                       f"{toolchain['llvm']}: regenerate them with `python3 -m tests.goldens --update`")
    if recorded.toolchain["libdevice_sha256"] != toolchain["libdevice_sha256"]:
        return set(recorded.kernels) - set(recorded.libdevice_kernels), \
            "another libdevice than the goldens': the kernels whose math calls it are not compared"
    return set(recorded.kernels), None


def unified_diff(name: str, recorded: str, generated: str) -> str:
    """The first DIFF_LINES lines of a unified diff between the recorded and the generated text."""
    lines = list(difflib.unified_diff(recorded.splitlines(), generated.splitlines(), f"golden/{name}",
                                      f"generated/{name}", lineterm="", n=3))
    more = f"\n... ({len(lines) - DIFF_LINES} more diff lines)" if len(lines) > DIFF_LINES else ""
    return "\n".join(lines[:DIFF_LINES]) + more


@dataclass
class Report:
    """How the text generated now differs from the recorded text of one target."""

    target: str
    changed: list[str] = field(default_factory=list)        # in both, with different text
    added: list[str] = field(default_factory=list)          # generated, never recorded
    removed: list[str] = field(default_factory=list)        # recorded, no longer generated
    first_diff: str = ""
    not_compared: str | None = None                         # why some kernels were skipped

    @property
    def ok(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def summary(self) -> str:
        parts = [f"{self.target}: {len(self.changed)} kernels' text changed {self.changed}" if self.changed else "",
                 f"{self.target}: not in the goldens {self.added}" if self.added else "",
                 f"{self.target}: in the goldens, no longer generated {self.removed}" if self.removed else ""]
        text = "\n".join(p for p in parts if p)
        advice = ("\nA refactor must not change generated code. If this change alters codegen on purpose, "
                  "regenerate with `python3 -m tests.goldens --update` and say why in the commit.")
        return text + ("\n\n" + self.first_diff if self.first_diff else "") + advice


def compare(target: str, recorded: Golden, generated: Golden) -> Report:
    """Every difference between the recorded and the generated goldens of `target`."""
    names, why = comparable(recorded, generated.toolchain)
    report = Report(target, not_compared=why,
                    added=sorted(set(generated.kernels) - set(recorded.kernels)),
                    removed=sorted(set(recorded.kernels) - set(generated.kernels)))
    for name in sorted(names & set(generated.kernels)):
        if recorded.kernels[name] != generated.kernels[name]:
            report.changed.append(name)
    if report.changed:
        name = report.changed[0]
        report.first_diff = unified_diff(name, recorded.kernels[name], generated.kernels[name])
    return report
