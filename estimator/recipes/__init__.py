"""Training recipes: named sets of slimserve-train flags, installed with the package, so
`slimserve-train --recipe=NAME` works from any folder (the flagfiles in the repository's
configs/ are the same files, kept there as the readable form; a test keeps them equal).

- `scratch`: every layer from random weights (configs/own_images_scratch.flags).
- `finetune`: a new head on a pretrained checkpoint (configs/own_images_finetune.flags);
  needs --checkpoint_path.
- `auto`: the route measured best for the case (docs/your-own-images.md): `finetune` with
  a --checkpoint_path, `scratch` without one. A newcomer runs the same command either way.

A recipe fills only the settings the command line (or a --flagfile) did not give: a flag
given always wins, even at its default value. For a --model_name other than the recipe's,
its scopes are renamed to that net's (the head: the net's own head scopes), and scopes the
net does not have are dropped, saying so.
"""
import dataclasses
import logging
import os

from slimserve import errors
from slimserve import fields
from slimserve.estimator import nets

AUTO = "auto"
FILES = {"finetune": "finetune.flags", "scratch": "scratch.flags"}
NAMES = (AUTO,) + tuple(sorted(FILES))
HELP = ("Training recipe: settings measured on small image sets (docs/your-own-images.md); "
        "flags given on the command line win. auto: finetune with --checkpoint_path, "
        "scratch without; finetune: new head on --checkpoint_path; scratch: every layer "
        "from random weights.")
_SCOPE_FIELDS = ("checkpoint_exclude_scopes", "freeze_scopes", "trainable_scopes")


def path(name):
    """The installed flagfile of recipe `name` (not `auto`)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), FILES[name])


def route(name, checkpoint_path):
    """The recipe `name` stands for: `auto` is finetune with a checkpoint, else scratch."""
    if name not in NAMES:
        raise errors.UserError("--recipe must be one of %s, got %r" % (", ".join(NAMES), name))
    if name == AUTO:
        return "finetune" if checkpoint_path else "scratch"
    return name


def settings(cls, name):
    """{field path: value} of recipe `name`'s flagfile, parsed as `cls`'s flags."""
    with open(path(name), encoding="utf-8") as handle:
        return fields.parse_flag_lines(cls, handle, path(name))


def _get(obj, field_path):
    for part in field_path:
        obj = getattr(obj, part)
    return obj


def _set(obj, field_path, value):
    """A copy of dataclass `obj` with the field at `field_path` set (sections copied)."""
    head, rest = field_path[0], field_path[1:]
    if not rest:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: _set(getattr(obj, head), rest, value)})


def _given(config, defaults):
    """The flag names `config` gave: what its command line named (fields.given_flags),
    or, for a config built in code, the fields that differ from their defaults."""
    if getattr(config, "given", None) is not None:
        return set(config.given)
    return {fields.flag_name(field) for path_, field in fields.walk(type(config))
            if _get(config, path_) != _get(defaults, path_)}


def _rename_scopes(scopes, source_net, target_net, flag):
    """The recipe's scopes of `source_net` as `target_net`'s: the head as its head, the
    others by prefix, those it lacks dropped (logged)."""
    source, target = nets.get_net(source_net), nets.get_net(target_net)
    renamed = []
    for scope in scopes:
        if scope in source.head_scopes:
            renamed += [s for s in target.head_scopes if s not in renamed]
            continue
        candidate = target.name + scope[len(source.name):]
        if candidate in target.scopes:
            renamed.append(candidate)
        else:
            logging.info("recipe: --%s: %s has no %s; left out", flag, target.name, candidate)
    return tuple(renamed)


def apply(config, name=None):
    """`config` (a TrainConfig) with recipe `name` (default: config.recipe) filling every
    setting it did not give; returns (config, one line saying what was taken). Unchanged,
    and None, without a recipe."""
    name = name or getattr(config, "recipe", None)
    if not name:
        return config, None
    chosen = route(name, config.model.checkpoint_path)
    defaults = type(config)()
    given = _given(config, defaults)
    recipe = settings(type(config), chosen)
    by_flag = {fields.flag_name(field): path_ for path_, field in fields.walk(type(config))}
    taken, kept = [], []
    for field_path, value in recipe.items():
        flag = next(f for f, p in by_flag.items() if p == field_path)
        if flag in given:
            if _get(config, field_path) != value:
                kept.append(flag)
            continue
        config = _set(config, field_path, value)
        taken.append(flag)
    recipe_net = recipe.get(by_flag["model_name"])
    if recipe_net and config.model.model_name != recipe_net:
        for flag in _SCOPE_FIELDS:
            if flag in taken:
                config = _set(config, by_flag[flag], _rename_scopes(
                    _get(config, by_flag[flag]), recipe_net, config.model.model_name, flag))
    why = {"finetune": "" if name != AUTO else " (--checkpoint_path given)",
           "scratch": "" if name != AUTO else " (no --checkpoint_path)"}[chosen]
    line = "recipe %s: %s%s, from %s: %d settings%s" % (
        name, chosen, why, path(chosen), len(taken),
        "; given, so kept: " + ", ".join("--" + f for f in kept) if kept else "")
    return config, line
