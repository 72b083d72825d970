"""Every Python package in the tree is listed in pyproject.toml, so a wheel install has it all."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_on_disk_is_packaged():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("rlgw", "gateway", "trainer", "migrations")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert config["package-dir"]["rlgw_sdk"] == "sdk"


def test_every_non_python_file_the_gateway_serves_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]["gateway.dashboard"]
    pages = {p.name for p in (ROOT / "gateway" / "dashboard").iterdir() if p.suffix == ".html"}
    assert pages and all(any(Path(name).match(g) for g in data) for name in pages)
