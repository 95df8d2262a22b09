"""The README documents every environment variable the package reads."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_environment_variable_the_package_reads_is_in_the_readme_table():
    variable = r"(?<!\w)TESSERA_[A-Z_]+"          # not a Python name like _TESSERA_DTYPES
    sources = [path.read_text() for path in (ROOT / "tessera").rglob("*.py")]
    used = {m for text in sources for m in re.findall(variable, text)}
    used -= {m for text in sources for m in re.findall(r"#define (TESSERA_[A-Z_]+)", text)}   # the C launchers' macros
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert used and used <= set(re.findall(r"TESSERA_[A-Z_]+", table)), sorted(used - set(re.findall(r"TESSERA_[A-Z_]+", table)))
