"""A recipe with a shape bug (the model expects 65 features, the data has 64): the smoke test must catch it."""

import dataclasses

import torch

from training.recipes import Recipe
from training.recipes.digits import recipe as digits_recipe


def build_model(params, meta):
    return torch.nn.Sequential(torch.nn.Linear(meta["features"] + 1, params.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(params.hidden, meta["classes"]))


def recipe() -> Recipe:
    return dataclasses.replace(digits_recipe(), name="digits-shape-bug", build_model=build_model)
