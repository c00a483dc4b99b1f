"""Running a command in this process, as its console script would, for tests of its
error paths, help and small runs: no fresh interpreter, no second TensorFlow import.

    result = run_command("slimserve.cli.export", "--model_dir", missing)
    assert result.code == 1 and "--model_dir" in result.stderr

The command module must be built on a config class (`CONFIG`, and `main(config, args)`,
as slimserve/cli/logs.py `run(main, config=...)` calls it); its flags are defined on a
fresh absl FlagValues each time, so commands that share flag names can be run one after
another. Flag parsing errors come back as absl's own app.run reports them (exit status 1
and `FATAL Flags parsing error: ...`). A command that needs a process of its own (signals,
a server that must die with its children) is run with tests/helpers.py run_cli instead.
"""
import contextlib
import dataclasses
import importlib
import io
import sys

from absl import flags

from slimserve import fields
from slimserve.cli import logs


@dataclasses.dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self):
        return self.stdout + self.stderr


def flag_values(module_name):
    """A fresh FlagValues holding the command's flags (those of its CONFIG)."""
    module = importlib.import_module(module_name)
    values = flags.FlagValues()
    fields.define_flags(module.CONFIG, values, module_name=module_name)
    return values


def checked_flags(module_name):
    """(the command's FlagValues, fields.flags_of(its CONFIG)), once the flags it defines
    are asserted to be its CONFIG's, by name and default: the command-line tests then
    compare the help texts."""
    module = importlib.import_module(module_name)
    defined = flag_values(module_name)
    expected = fields.flags_of(module.CONFIG)
    assert sorted(defined) == sorted(expected), module_name
    for name, (default, _) in expected.items():
        assert defined[name].default == default, name
    return defined, expected


def help_text(module_name):
    """What `--help` lists for the command: every flag with its help."""
    return flag_values(module_name).get_help()


def run_command(module_name, *args):
    """Parses `args` as the command's command line and runs its main in this process ->
    Result(exit status, stdout, stderr)."""
    module = importlib.import_module(module_name)
    values = flag_values(module_name)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            argv = values([logs.command_name(module_name)] + [str(a) for a in args])
            logs.call(logs.command_name(module_name),
                      lambda: module.main(fields.from_flags(module.CONFIG, values), argv[1:]))
        except flags.Error as error:
            sys.stderr.write("FATAL Flags parsing error: %s\n" % error)
            code = 1
        except SystemExit as stop:
            if isinstance(stop.code, str):
                sys.stderr.write(stop.code + "\n")
                code = 1
            else:
                code = stop.code or 0
    return Result(code, out.getvalue(), err.getvalue())
