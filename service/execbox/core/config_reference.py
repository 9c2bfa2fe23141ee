"""The configuration reference (docs/operations.md), generated from the settings root so they never disagree.

The root (`execbox.settings.Settings`) sits above the rooms, so the core cannot import it: the
caller hands it in (`scripts/config-reference`, tests/unit/test_docs.py)."""

from __future__ import annotations

from pydantic import BaseModel


def _rows(model: type[BaseModel], env_prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _rows(annotation, f"{env_prefix}{name.upper()}__")
            continue
        if name in ("policies_dir", "images_dir", "artifacts_dir"):
            default: object = "(repository folder)"
        else:
            default = field.get_default(call_default_factory=True)  # default_factory fields too
        rows.append(f"| `{env_prefix}{name.upper()}` | `{default}` | {field.description or ''} |")
    return rows


def render(root: type[BaseModel]) -> str:
    """The table of every EXECBOX_ variable of `root`, in its fields' order."""
    header = ["| variable | default | meaning |", "|---|---|---|"]
    return "\n".join(header + _rows(root, "EXECBOX_")) + "\n"
