"""The committed JSON schema is current, and every recipe validates against it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from sm120.recipe.export import schema_text
from tests.helpers import REPO

RECIPES = REPO / "recipes"


def test_committed_schema_is_current() -> None:
    committed = (RECIPES / "recipe.schema.json").read_text()
    assert committed == schema_text(), "run: sm120 schema --write"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_recipe_matches_json_schema(path: Path) -> None:
    schema = json.loads((RECIPES / "recipe.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    assert path.read_text().startswith("# yaml-language-server: $schema=./recipe.schema.json")


def test_every_field_is_described() -> None:
    schema = json.loads(schema_text())
    missing = [
        f"{name}.{field}"
        for name, definition in [("Recipe", schema), *schema["$defs"].items()]
        for field, spec in definition.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert missing == []


def test_json_schema_rejects_an_unknown_key() -> None:
    schema = json.loads(schema_text())
    data = yaml.safe_load((RECIPES / "tiny.yaml").read_text())
    data["titel"] = "typo"
    with pytest.raises(jsonschema.ValidationError, match="titel"):
        jsonschema.validate(data, schema)
