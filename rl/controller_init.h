// Internal to the controller: the init op's arguments of each role, decided from the recipe
// here so that workers never read recipes.
#pragma once
#include "rl/recipe.h"
#include "roles/client.h"

// Storage for the strings a tr_init_args points at.
typedef struct tr_role_setup {
    tr_init_args a;
    char model[TR_RECIPE_PATH_MAX];
    char init_config[TR_RECIPE_PATH_MAX];
    char tokenizer[TR_RECIPE_PATH_MAX + 32];
} tr_role_setup;

// Fills s with role's init args (the role must be present in r).
void tr_controller_role_setup(const tr_recipe *r, enum tr_recipe_role role, tr_role_setup *s);
