"""The flags of slimserve-train, -export, -convert and -retrain are their config objects: the flags a
command really defines have its fields' names, defaults and help (nothing written twice,
no flags.DEFINE_ left in the command), every bound refuses what it says, naming the flag,
and a run's flags.txt and the repository's flagfiles give their configs back."""
import glob
import importlib
import inspect
import math
import os

import pytest
from absl import flags

from slimserve import errors
from slimserve import fields
from slimserve.estimator import nets
from slimserve.estimator import recipes
from slimserve.estimator import train_config
from slimserve.testing import commands
from tests.helpers import ROOT

COMMANDS = ("slimserve.cli.train", "slimserve.cli.export", "slimserve.cli.convert",
            "slimserve.cli.retrain")
# What each command requires, so the other flags can be tried one at a time.
REQUIRED = {"slimserve.cli.train": ["--data_dir=d", "--model_dir=m"],
            "slimserve.cli.export": ["--model_dir=m"],
            "slimserve.cli.convert": ["--input=i", "--output_dir=o"],
            "slimserve.cli.retrain": ["--labels_dir=l", "--data_dir=d", "--model_dir=m"]}


def _help(flag):
    """absl's help of a flag without the `<a|b|c>: ` it puts before an enum's help."""
    if isinstance(flag.parser, flags.EnumParser):
        prefix = "<%s>: " % "|".join(flag.parser.enum_values)
        assert flag.help.startswith(prefix), flag.help
        return flag.help[len(prefix):]
    return flag.help


@pytest.mark.parametrize("module_name", COMMANDS)
def test_flags_defined_are_the_config_fields(module_name):
    defined, expected = commands.checked_flags(module_name)
    for name, (_, help_text) in expected.items():
        assert _help(defined[name]) == help_text, name
    source = inspect.getsource(importlib.import_module(module_name))
    assert "DEFINE_" not in source and "FLAGS" not in source
    # Importing the command defined nothing; its flags exist only once it runs.
    assert module_name not in flags.FLAGS.flags_by_module_dict()


@pytest.mark.parametrize("module_name", COMMANDS)
def test_every_bound_refuses_zero_minus_one_and_nan_where_it_says_naming_the_flag(
        module_name):
    """Each bounded field, given 0, -1 and NaN (floats) on the command line: refused by
    the flag parser with a message naming the flag exactly when its bound says so."""
    config = importlib.import_module(module_name).CONFIG
    refused = 0
    for _, field in fields.walk(config):
        bound = field.metadata.get("bound")
        if bound is None:
            continue
        name = fields.flag_name(field)
        values = [0, -1] + ([math.nan] if field.metadata["kind"] is float else [])
        for value in values:
            parser = commands.flag_values(module_name)
            argv = ["command"] + REQUIRED[module_name] + ["--%s=%s" % (name, value)]
            if bound.accepts(value):
                parser(argv)
                continue
            with pytest.raises(flags.IllegalFlagValueError) as error:
                parser(argv)
            assert "--%s must be %s" % (name, bound.rule) in str(error.value)
            refused += 1
    assert refused >= 3  # the test tried something a bound refuses


def test_train_config_bounds_hold_for_library_users_too():
    """A TrainConfig built in code is checked by the same bounds (fields.check), naming
    the flag; the derived values stay unset until the run fills them."""
    config = train_config.TrainConfig()
    config.data.data_dir, config.run.model_dir = "d", "m"
    assert config.validate() is config
    for section, name, value in (("input", "batch_size", 0), ("model", "learning_rate", -1.0),
                                 ("model", "label_smoothing", math.nan),
                                 ("run", "max_steps", 0), ("guards", "max_loss_factor", 0.5)):
        broken = train_config.TrainConfig()
        broken.data.data_dir, broken.run.model_dir = "d", "m"
        setattr(getattr(broken, section), name, value)
        with pytest.raises(errors.UserError, match="^--%s must be " % name):
            broken.validate()
    with pytest.raises(errors.UserError, match="--data_dir is required"):
        train_config.TrainConfig().validate()


def _train_config(*args):
    values = commands.flag_values("slimserve.cli.train")
    values(["slimserve-train"] + [str(a) for a in args])
    return fields.from_flags(train_config.TrainConfig, values).validate()


def test_flags_txt_gives_the_run_config_back(tmp_path):
    config = _train_config("--data_dir=d", "--model_dir=m", "--optimizer=adam",
                           "--checkpoint_exclude_scopes=resnet_v1_50/logits,x",
                           "--boundaries=10,20", "--boundary_values=1,0.5,0.1",
                           "--learning_rate_schedule=piecewise", "--norandom_flip",
                           "--min_aspect_ratio=0.7", "--cache=", "--max_loss_factor=0")
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text(config.flagfile_text())
    assert _train_config("--flagfile=%s" % flagfile) == config
    # Unset values stay unset, so they are derived again (and a later flag still wins).
    assert "--opt_epsilon" not in flagfile.read_text()
    assert _train_config("--flagfile=%s" % flagfile, "--mode=eval").run.mode == "eval"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.flags"))))
def test_repository_flagfiles_are_valid_train_configs(path):
    config = _train_config("--flagfile=%s" % path, "--data_dir=d", "--model_dir=m")
    assert config.model.model_name


# The repository's readable flagfile of each installed recipe.
RECIPE_FLAGFILES = {"finetune": "own_images_finetune.flags",
                    "scratch": "own_images_scratch.flags"}


def test_installed_recipes_are_the_repository_flagfiles():
    assert sorted(recipes.FILES) == sorted(RECIPE_FLAGFILES)
    for name, flagfile in RECIPE_FLAGFILES.items():
        installed = recipes.path(name)
        assert os.path.dirname(installed) == os.path.dirname(recipes.__file__)
        with open(installed, "rb") as a, open(os.path.join(ROOT, "configs", flagfile),
                                               "rb") as b:
            assert a.read() == b.read(), name
        # Each recipe is a valid config by itself.
        assert recipes.settings(train_config.TrainConfig, name)


def test_recipe_fills_only_what_the_command_line_did_not_give():
    scratch = _train_config("--data_dir=d", "--model_dir=m", "--recipe=auto",
                            "--max_steps=2000", "--learning_rate=0.01")
    applied, line = recipes.apply(scratch)
    assert line.startswith("recipe auto: scratch (no --checkpoint_path)")
    assert "given, so kept: --max_steps, --learning_rate" in line
    # Given at its default value (0.01) still wins over the recipe's 3e-3.
    assert applied.model.learning_rate == 0.01 and applied.run.max_steps == 2000
    assert applied.model.optimizer == "adam" and not applied.input.random_flip
    assert applied.model.freeze_scopes == () == applied.model.checkpoint_exclude_scopes
    # With a checkpoint the same command takes the fine-tuning route.
    tuned, line = recipes.apply(_train_config("--data_dir=d", "--model_dir=m",
                                              "--recipe=auto", "--checkpoint_path=c"))
    assert line.startswith("recipe auto: finetune (--checkpoint_path given)")
    assert tuned.model.checkpoint_exclude_scopes == ("resnet_v1_50/logits",)
    # Another net: the recipe's scopes become that net's.
    other, _ = recipes.apply(_train_config("--data_dir=d", "--model_dir=m", "--recipe=auto",
                                           "--checkpoint_path=c", "--model_name=resnet_v2_50"))
    assert other.model.checkpoint_exclude_scopes == ("resnet_v2_50/logits",)
    assert all(s.startswith("resnet_v2_50/") for s in other.model.freeze_scopes)
    assert len(other.model.freeze_scopes) == len(tuned.model.freeze_scopes)
    # A library user's config: what differs from the defaults counts as given.
    config = train_config.TrainConfig(recipe="scratch")
    config.data.data_dir, config.run.model_dir = "d", "m"
    config.model.learning_rate = 0.05
    applied, _ = recipes.apply(config)
    assert applied.model.learning_rate == 0.05 and applied.model.optimizer == "adam"


def test_recipe_and_model_name_choices_are_listed_in_help():
    text = commands.help_text("slimserve.cli.train")
    assert "--recipe: <auto|finetune|scratch>: Training recipe" in text
    assert "--model_name: <resnet_v1_101|" in text
    defined = commands.flag_values("slimserve.cli.train")
    assert defined["model_name"].parser.enum_values == sorted(nets.NETS)
    with pytest.raises(flags.IllegalFlagValueError):
        _train_config("--data_dir=d", "--model_dir=m", "--recipe=fast")
