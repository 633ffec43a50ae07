"""The recipe JSON schema, exported from the pydantic models and committed beside the recipes
so editors complete and check them."""

from __future__ import annotations

import json
from pathlib import Path

from sm120.recipe.loader import recipes_dir
from sm120.recipe.schema import Recipe


def schema_text() -> str:
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "sm120 recipe"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schema_path() -> Path:
    return recipes_dir() / "recipe.schema.json"
