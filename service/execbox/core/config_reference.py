"""The configuration reference (docs/operations.md), generated from Settings so they never disagree."""

from __future__ import annotations

from pydantic import BaseModel

from execbox.core.settings import Settings


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


def render() -> str:
    header = ["| variable | default | meaning |", "|---|---|---|"]
    return "\n".join(header + _rows(Settings, "EXECBOX_")) + "\n"


if __name__ == "__main__":
    print(render(), end="")  # noqa: T201
