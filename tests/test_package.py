"""The package as it installs: the core without the laboratory, the kernel sources inside the wheel,
the package list in pyproject.toml matching the tree, and one module reading KESTREL_ variables."""
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_kestrel_loads_no_lab_and_no_figure_library():
    probe = ("import kestrel, sys; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('plotly', 'ipywidgets', 'anywidget') or m.startswith('kestrel.lab'))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert r.stdout.strip() == ""


def test_the_core_never_imports_the_lab():
    """No module outside kestrel/lab names kestrel.lab (top-level or function-local imports)."""
    for p in (ROOT / "kestrel").rglob("*.py"):
        if "lab" in p.relative_to(ROOT / "kestrel").parts:
            continue
        text = p.read_text()
        assert not re.search(r"^\s*(from|import)\s+(kestrel\.lab|\.+lab)\b", text, re.M), p


def test_pyproject_lists_every_package():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kestrel").rglob("__init__.py")}
    assert set(cfg["packages"]) == tree | {"kestrel.kernels"}
    assert cfg["package-dir"]["kestrel.kernels"] == "kernels"


def test_environment_read_in_one_module():
    readers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "kestrel").rglob("*.py")
               if re.search(r"os\.environ|getenv", p.read_text())]
    assert readers == ["kestrel/settings.py"]


def test_wheel_holds_the_kernel_sources_and_the_model(tmp_path):
    """A non-editable build (of a copy: a build writes build/ beside the sources): the .cu sources
    ship as kestrel/kernels/, the embedded model as assets."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "kestrel", "kernels"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("kestrel-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for cu in (ROOT / "kernels").iterdir():
        assert f"kestrel/kernels/{cu.name}" in names, cu.name
    assert "kestrel/assets/tiny/model.safetensors" in names
    assert not any(n.startswith(("dev/", "scripts/", "tests/")) for n in names)
