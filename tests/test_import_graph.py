"""The layers hold: no import points up (or sideways between peers) and no package imports in a circle."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402


def test_repository_has_no_upward_arrow_and_no_circle():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "upward or peer arrows: 0" in r.stdout
    assert "import circles: 0" in r.stdout


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_a_lazy_upward_import_is_an_arrow(tmp_path):
    root = _tree(tmp_path, {
        "fa4/__init__.py": "",
        "fa4/lookup.py": "def f():\n    from store.engine import URL\n    return URL\n",
        "store/__init__.py": "",
        "store/engine.py": "from fa4 import lookup\nURL = 1\n",
    })
    res = import_graph.analyse(root)
    assert set(res["bad_arrows"]) == {("fa4", "store")}
    assert res["bad_arrows"][("fa4", "store")] == [("fa4.lookup", "store.engine")]


def test_peers_and_import_module_literals_count(tmp_path):
    root = _tree(tmp_path, {
        "tuner/__init__.py": "",
        "tuner/cli.py": "import importlib\nimportlib.import_module('service.app')\n",
        "service/__init__.py": "",
        "service/app.py": "",
        "tests/test_x.py": "import service.app\nimport tuner.cli\n",
    })
    res = import_graph.analyse(root)
    assert set(res["bad_arrows"]) == {("tuner", "service")}


def test_a_circle_inside_a_package_is_found(tmp_path):
    root = _tree(tmp_path, {
        "fa4/__init__.py": "",
        "fa4/a.py": "from . import b\n",
        "fa4/b.py": "def g():\n    from fa4 import c\n",
        "fa4/c.py": "import fa4.a\n",
        "fa4/d.py": "import fa4.a\n",
    })
    res = import_graph.analyse(root)
    assert res["circles"] == [["fa4.a", "fa4.b", "fa4.c"]]
    assert not res["bad_arrows"]
