"""Built-in recipes and the plug-in interface."""

from training.recipes.base import BUILTIN, Dataset, EmptyDataError, Recipe, RecipeParams, StepOutput, resolve_recipe

__all__ = ["BUILTIN", "Dataset", "EmptyDataError", "Recipe", "RecipeParams", "StepOutput", "resolve_recipe"]
