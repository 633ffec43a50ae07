"""Recipes: the YAML data under recipes/, its schema, and loading it."""
