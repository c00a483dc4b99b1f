"""The tool commands (client, loadtest, compare, tune, tune_batching, predict, drift) are built
on config classes: every flag comes from a field of the command's CONFIG (name, default,
help and bound written once), no module defines a flag of its own, every number has a
bound that the command enforces with a message naming the flag, and --help lists them."""
import importlib
import inspect

import pytest
from absl import flags

from slimserve import fields
from slimserve.testing import commands

COMMANDS = ("slimserve.cli.client", "slimserve.cli.loadtest", "slimserve.cli.compare",
            "slimserve.cli.tune", "slimserve.cli.tune_batching", "slimserve.cli.predict",
            "slimserve.cli.drift")
# The modules the commands are made of: none may define an absl flag.
MODULES = COMMANDS + ("slimserve.cli.tuning",)


@pytest.mark.parametrize("module_name", COMMANDS)
def test_every_flag_is_a_field_of_the_config(module_name):
    values, expected = commands.checked_flags(module_name)
    for name, (_, help_text) in expected.items():
        # absl adds "<a|b>: " before an enum's help and "repeat this option" after a
        # repeatable flag's; the text itself is the field's
        assert help_text in values[name].help, name
    module = importlib.import_module(module_name)
    assert callable(module.main) and list(inspect.signature(module.main).parameters) == [
        "config", "args"]


@pytest.mark.parametrize("module_name", MODULES)
def test_no_module_defines_flags_of_its_own(module_name):
    module = importlib.import_module(module_name)
    assert "flags.DEFINE_" not in inspect.getsource(module)
    assert not flags.FLAGS.flags_by_module_dict().get(module_name)


@pytest.mark.parametrize("module_name", COMMANDS)
def test_every_number_has_a_bound(module_name):
    config = importlib.import_module(module_name).CONFIG
    for _, field in fields.walk(config):
        kind = field.metadata["kind"]
        numeric = kind in (int, float) or (kind is list and field.metadata.get("item") is int)
        if numeric:
            assert field.metadata["bound"] is not None, field.name


@pytest.mark.parametrize("module_name, args, message", [
    ("slimserve.cli.client", ["status", "--concurrency=0"], "--concurrency must be in [1, 1024]"),
    ("slimserve.cli.loadtest", ["--images=x", "--concurrency=1,0"],
     "--concurrency must be in [1, 1024]"),
    ("slimserve.cli.compare", ["--logs=x", "--baseline=b", "--candidate=c",
                               "--min_agreement=1.5"], "--min_agreement must be in [0, 1]"),
    ("slimserve.cli.tune", ["--model_base_path=m", "--latency_budget_ms=10",
                            "--max_batch_sizes=8,0"], "--max_batch_sizes must be in [1, "),
    ("slimserve.cli.tune_batching", ["--model_base_path=m", "--latency_budget_ms=10",
                                     "--images=x", "--max_batch_sizes=8,x"],
     "--max_batch_sizes: expected a comma-separated list of int, got 8,x"),
    ("slimserve.cli.predict", ["--model_base_path=m", "--input=i", "--output=o",
                               "--read_threads=0"], "--read_threads must be in [1, 256]"),
    ("slimserve.cli.drift", ["--logs=x", "--model_base_path=m", "--alpha=1"],
     "--alpha must be in (0, 1)"),
])
def test_a_value_out_of_bounds_is_one_line_naming_the_flag(module_name, args, message):
    result = commands.run_command(module_name, *args)
    assert result.code == 1 and "Traceback" not in result.output
    assert message in result.stderr, result.stderr


def test_required_flags_and_help(tmp_path):
    missing = commands.run_command("slimserve.cli.tune_batching", "--model_base_path=m",
                                   "--latency_budget_ms=10")
    assert missing.code == 1 and "--images" in missing.stderr
    text = commands.help_text("slimserve.cli.tune")
    for name in ("--max_batch_sizes", "--server_flag", "--output_flags", "--precisions"):
        assert name in text
    assert "(in [1, 1024])" in text  # --concurrency's bound is in its help
    predict = commands.help_text("slimserve.cli.predict")
    assert "--runner" in predict and "--beam_options" in predict  # cli/beam.py's section
