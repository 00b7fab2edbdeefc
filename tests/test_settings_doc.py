"""docs/settings.md lists every setting, with its default."""

from pathlib import Path

from raylane.orchestrator.settings import Settings

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def test_every_setting_is_documented_with_its_default():
    text = DOC.read_text()
    for name, field in Settings.model_fields.items():
        default = "unset" if field.default is None else str(field.default)
        assert f"| `RAYLANE_{name.upper()}` | `{default}` |" in text, name
