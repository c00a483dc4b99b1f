"""Typed configuration objects whose fields are also command-line flags.

One place for each value's flag name, type, default, help text and bound, as Model
Garden's typed configs and TF Serving's Server::Options: a command defines its flags from
its config class and builds the object from the parsed flags; a library takes the object.
Nothing about a flag is written twice, and every value is checked once, by `check`, with a
message naming the flag (or the file and field it came from).

    @dataclasses.dataclass
    class ConvertConfig:
        input: str = fields.option(None, "Folder of class sub-folders, or a CSV.",
                                   required=True)
        validation_fraction: float = fields.option(0.1, "Share held out.",
                                                   bound=fields.Bound(0.0, 1.0, upper_open=True))

    fields.define_flags(ConvertConfig)             # in the command module, at import
    config = fields.from_flags(ConvertConfig)      # in main(): built and checked

A field whose default is a dataclass instance made with `section(Cls)` is a group of
flags: its fields are flags too (names are unique across a config), so a training config
can be built from model, input and run sections while its command line stays flat.
"""
import dataclasses
import math

from slimserve import errors

# Integer and float limits the bounds below use where a field has no natural ceiling: far
# above any sensible value, low enough that arithmetic on it cannot overflow (a thread
# count, a byte count, a timeout in microseconds).
INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1


class Bound:
    """The values a field accepts: lower/upper (inclusive unless *_open), plus `also`, a
    few special values outside them (e.g. -1 for AUTOTUNE). NaN never passes."""

    def __init__(self, lower=None, upper=None, lower_open=False, upper_open=False, also=()):
        self.lower, self.upper = lower, upper
        self.lower_open, self.upper_open = lower_open, upper_open
        self.also = tuple(also)

    def accepts(self, value):
        if value in self.also:
            return True
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.lower is not None and (value <= self.lower if self.lower_open
                                       else value < self.lower):
            return False
        if self.upper is not None and (value >= self.upper if self.upper_open
                                       else value > self.upper):
            return False
        return True

    @property
    def rule(self):
        """The bound in words: "> 0", "in [0, 1)", "-1 or in [1, 64]"."""
        low, high = self.lower, self.upper
        if low is not None and high is not None:
            text = "in %s%s, %s%s" % ("(" if self.lower_open else "[", _num(low), _num(high),
                                      ")" if self.upper_open else "]")
        elif low is not None:
            text = "%s %s" % (">" if self.lower_open else ">=", _num(low))
        elif high is not None:
            text = "%s %s" % ("<" if self.upper_open else "<=", _num(high))
        else:
            text = "any number"
        if self.also:
            text = "%s or %s" % (" or ".join(_num(v) for v in self.also), text)
        return text

    def __repr__(self):
        return "Bound(%s)" % self.rule


def _num(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return "%d" % value
    return repr(value) if isinstance(value, float) else str(value)


# Common bounds, so the same rule reads the same everywhere.
POSITIVE = Bound(0, lower_open=True)
NON_NEGATIVE = Bound(0)
FRACTION = Bound(0.0, 1.0, upper_open=True)          # [0, 1)
OPEN_FRACTION = Bound(0.0, 1.0, True, True)          # (0, 1)
SHARE = Bound(0.0, 1.0, lower_open=True)             # (0, 1]
PROBABILITY = Bound(0.0, 1.0)                        # [0, 1]


def option(default, help_text, bound=None, *, choices=None, required=False, flag=None,
           kind=None, **extra):
    """A field that is a command-line flag.

    bound: a Bound (numbers); choices: the allowed strings (an enum flag); required: the
    command refuses to run without it; flag: the flag's name when it differs from the
    field's; kind: bool/int/float/str/list when the default does not say it (None or a
    tuple of numbers). Further keywords land in the field's metadata (e.g.
    slimserve_only=True, or repeat=True: a list flag given once per value,
    `--name=a --name=b`, instead of comma-separated) for the config's own use."""
    if kind is None:
        kind = type(default) if default is not None and not isinstance(default, tuple) \
            else (list if isinstance(default, tuple) else str)
    metadata = dict(extra, help=help_text, bound=bound, choices=tuple(choices or ()),
                    required=required, flag=flag, kind=kind, option=True)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls):
    """A field holding a nested config whose fields are flags too."""
    return dataclasses.field(default_factory=cls, metadata={"section": True})


def given_flags():
    """A field (not a flag) that `from_flags` fills with the names of the flags the command
    line gave (absl's `present`: typed, or read from a --flagfile), so a config can tell a
    value given at its default from one left unset. None for a config built in code."""
    return dataclasses.field(default=None, compare=False, repr=False,
                             metadata={"given": True})


def flag_name(field):
    return field.metadata.get("flag") or field.name


def walk(cls):
    """[(path of field names, Field)] of every flag field of `cls`, sections flattened,
    in definition order."""
    found = []
    for field in dataclasses.fields(cls):
        if field.metadata.get("section"):
            found += [((field.name,) + path, f) for path, f in walk(field.default_factory)]
        elif field.metadata.get("option"):
            found.append(((field.name,), field))
    return found


def _get(obj, path):
    for name in path:
        obj = getattr(obj, name)
    return obj


def violation(field, value, where=None):
    """The message for a value outside its field's bound or choices, else None.
    `where`: None names the flag (`--name`); a file names its field (`file x: name`)."""
    if value is None:
        return None  # unset: derived or not used (the config says which)
    name = "--%s" % flag_name(field) if where is None else "%s: %s" % (where, field.name)
    choices = field.metadata.get("choices")
    if choices:
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item not in choices:
                return "%s must be one of %s, got %r" % (name, ", ".join(choices), item)
        return None
    bound = field.metadata.get("bound")
    if bound is None:
        return None
    values = value if isinstance(value, (list, tuple)) else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if not bound.accepts(item):
            return "%s must be %s, got %r" % (name, bound.rule, item)
    return None


def check(config, where=None):
    """Raises UserError for the first field (sections included) outside its bound or
    choices; returns `config`. `where` as in `violation`."""
    for path, field in walk(type(config)):
        message = violation(field, _get(config, path), where)
        if message:
            raise errors.UserError(message)
    return config


def bounds_table(cls):
    """[(flag, rule)] of every bounded field: the table docs/reliability.md shows."""
    rows = []
    for _, field in walk(cls):
        if field.metadata.get("choices"):
            rows.append((flag_name(field), "one of " + ", ".join(field.metadata["choices"])))
        elif field.metadata.get("bound") is not None:
            rows.append((flag_name(field), field.metadata["bound"].rule))
    return rows


def help_text(field):
    """The flag's help: the field's text plus its bound, so --help shows the rule."""
    text = field.metadata["help"]
    bound = field.metadata.get("bound")
    if bound is not None and bound.rule not in text:
        text += " (%s)" % bound.rule
    return text


def define_flags(cls, flag_values=None, module_name=None):
    """Defines one absl flag per field of `cls` (sections flattened), each validated by
    its field's bound; required fields are marked required. module_name: the command's
    module, which absl files the flags under (else this module, and --help, which lists the
    main module's flags, would not show them)."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    flag_values = flags.FLAGS if flag_values is None else flag_values
    owner = {} if module_name is None else {"module_name": module_name}
    for _, field in walk(cls):
        name, kind, default = flag_name(field), field.metadata["kind"], field.default
        text = help_text(field)
        choices = field.metadata.get("choices")
        if kind is list and field.metadata.get("repeat"):
            flags.DEFINE_multi_string(name, list(default) if default is not None else None,
                                      text, flag_values=flag_values)
        elif kind is list:
            flags.DEFINE_list(name, list(default) if default is not None else None, text,
                              flag_values=flag_values, **owner)
        elif choices:
            flags.DEFINE_enum(name, default, list(choices), text, flag_values=flag_values,
                              **owner)
        else:
            definer = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
                       float: flags.DEFINE_float, str: flags.DEFINE_string}[kind]
            definer(name, default, text, flag_values=flag_values, **owner)
        if field.metadata.get("bound") is not None:
            flags.register_validator(
                name, lambda value, f=field: violation(f, _converted(f, value)) is None,
                message=_rule_message(field), flag_values=flag_values)
        if field.metadata.get("required"):
            flags.mark_flag_as_required(name, flag_values=flag_values)


def _rule_message(field):
    return "--%s must be %s" % (flag_name(field), field.metadata["bound"].rule)


def _converted(field, value, strict=False):
    """A flag's parsed value as the field holds it: lists become tuples, of numbers when
    the field says (metadata `item`). strict: an item that does not parse is a UserError
    naming the flag (else it is left as text, for the validator to pass over)."""
    if value is None or field.metadata["kind"] is not list:
        return value
    item = field.metadata.get("item", str)
    try:
        return tuple(item(v) for v in value)
    except ValueError:
        if strict:
            raise errors.UserError("--%s: expected a comma-separated list of %s, got %s"
                                   % (flag_name(field), item.__name__, ",".join(value))) \
                from None
        return tuple(value)


def from_flags(cls, flag_values=None, **overrides):
    """The config the parsed flags describe (sections built from their flags), checked.
    `overrides`: top-level field values to use instead of their flags."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    flag_values = flags.FLAGS if flag_values is None else flag_values
    return check(_build(cls, flag_values, overrides))


def _build(cls, flag_values, overrides):
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in overrides:
            values[field.name] = overrides[field.name]
        elif field.metadata.get("given"):
            values[field.name] = frozenset(
                flag_name(f) for _, f in walk(cls) if flag_values[flag_name(f)].present)
        elif field.metadata.get("section"):
            values[field.name] = _build(field.default_factory, flag_values, {})
        elif field.metadata.get("option"):
            values[field.name] = _converted(field, flag_values[flag_name(field)].value,
                                            strict=True)
    return cls(**values)


def flags_of(cls):
    """{flag name: (default, help text)} a command built from `cls` defines: what the
    command-line test compares with the flags really defined."""
    return {flag_name(f): (list(f.default) if f.metadata["kind"] is list and
                           f.default is not None else f.default, help_text(f))
            for _, f in walk(cls)}


def replace(config, **changes):
    """dataclasses.replace, checked."""
    return check(dataclasses.replace(config, **changes))




def flag_lines(config):
    """`--name=value` lines for every flag field of `config` (sections included): a
    flagfile that gives the same config back (what a training run leaves in flags.txt).
    Unset (None) values are left out, so they stay derived."""
    lines = []
    for path, field in walk(type(config)):
        value = _get(config, path)
        if value is None:
            continue
        name = flag_name(field)
        if field.metadata["kind"] is bool:
            lines.append("--%s%s" % ("" if value else "no", name))
        elif field.metadata["kind"] is list and field.metadata.get("repeat"):
            lines += ["--%s=%s" % (name, v) for v in value]
        elif field.metadata["kind"] is list:
            lines.append("--%s=%s" % (name, ",".join(str(v) for v in value)))
        else:
            lines.append("--%s=%s" % (name, value))
    return lines


_TRUE, _FALSE = ("true", "t", "1", "yes"), ("false", "f", "0", "no")


def parse_flag_lines(cls, lines, source):
    """{field path: value} of a flagfile's `--name=value` lines (`--name` / `--noname` for
    booleans; blank lines and `#` comments skipped) for the flags of `cls`; every value is
    checked against its field's bound and choices. A line that is not one of `cls`'s flags,
    or a value that does not parse, is a UserError naming `source` and the line."""
    by_name = {flag_name(f): (path, f) for path, f in walk(cls)}
    found = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = "%s:%d" % (source, number)
        name, sep, text = line[2:].partition("=") if line.startswith("--") else ("", "", "")
        negated = not sep and name.startswith("no") and name[2:] in by_name and \
            by_name[name[2:]][1].metadata["kind"] is bool
        if negated:
            name = name[2:]
        if name not in by_name:
            raise errors.UserError("%s: %r is not a flag of this command" % (where, line))
        path, field = by_name[name]
        kind = field.metadata["kind"]
        try:
            if kind is bool:
                if sep and text.lower() not in _TRUE + _FALSE:
                    raise ValueError(text)
                value = (not negated) if not sep else text.lower() in _TRUE
            elif not sep:
                raise ValueError("no value")
            elif kind is list:
                item = field.metadata.get("item", str)
                value = tuple(item(v) for v in text.split(",") if v != "")
            else:
                value = kind(text)
        except ValueError:
            raise errors.UserError("%s: %r: not a valid value of --%s" % (where, line, name)) \
                from None
        message = violation(field, value)
        if message:
            raise errors.UserError("%s: %s" % (where, message))
        found[path] = value
    return found
