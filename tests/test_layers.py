"""The apps' arrows as docs/DESIGN.md draws them, read from every module's imports (lazy ones inside functions too):
the recommender knows nothing of fc2, provisioner or monitor; provisioner knows no Django views or templates; the
monitor reads fc2's models but never reaches up into fc2's services or views, which call it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "recommender": ("fc2", "provisioner", "monitor"),
    "provisioner": ("fc2.views", "fc2.wizard", "fc2.services", "django.shortcuts", "django.template"),
    "monitor": ("fc2.services", "fc2.views", "fc2.wizard", "fc2.api", "fc2.tasks"),
}


def imports(path: Path) -> set[str]:
    """Every module a file imports, wherever the import statement is."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("app", sorted(FORBIDDEN))
def test_an_app_imports_nothing_its_layer_may_not(app):
    crossings = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts and "tests" not in path.parts
        for name in sorted(imports(path))
        if any(name == banned or name.startswith(f"{banned}.") for banned in FORBIDDEN[app])
    ]
    assert crossings == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fc2.services.feedback import record_job\n")
    assert "fc2.services.feedback" in imports(module)
