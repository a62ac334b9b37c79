"""Built-in recipes and the plug-in interface."""

from training.recipes.base import (BUILTIN, Dataset, EmptyDataError, Ratio, Recipe, RecipeError, RecipeParams, StepOutput,
                                  lr_factor, resolve_recipe)

__all__ = ["BUILTIN", "Dataset", "EmptyDataError", "Ratio", "Recipe", "RecipeError", "RecipeParams", "StepOutput", "lr_factor",
           "resolve_recipe"]
