"""JSON text -> Python values as TF Serving's rapidjson 1.1.0 reads a request body
(util/json_tensor.cc's ParseJson: kParseNanAndInfFlag, UTF-8 in and out, no encoding
validation), with its error messages and offsets.

Python's json module does the parsing; what rapidjson does differently is done around it,
and only for bodies that need it (each check is a C-speed scan of the text first):
- bytes that are not UTF-8 pass through strings as they are (surrogateescape; written
  back by json_writer.to_bytes), a lone high surrogate escape (`\\ud800`) is an error, a
  lone low one is kept as its three bytes, control characters and NUL get rapidjson's
  messages;
- `NaN`, `Inf`, `Infinity`, `-Inf`, `-Infinity` and `-NaN` are numbers;
- numbers: an integer past uint64 (or past -2^63) becomes a double, a number whose
  exponent or digits pass rapidjson's limit is `Number too big to be stored in double`
  at the number's offset, and `exact=True` computes every double with rapidjson's own
  (normal precision) arithmetic, which can differ from a correctly rounded parse by an
  ULP for long or far-exponent numbers (rest_json asks for it when a double tensor is
  read).
"""
import json
import re

# Python's json messages -> rapidjson's GetParseError_En (the ones a client meets).
_PARSE_ERRORS = (
    ("Expecting value", "Invalid value."),
    ("Expecting property name enclosed in double quotes", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Extra data", "The document root must not be followed by other values."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid control character", "Invalid escape character in string."),
)
TOO_BIG = "Number too big to be stored in double."
SURROGATE = "The surrogate pair in string is invalid."
# A string, or a token outside strings: a number, or a NaN / Inf spelling.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)'
                     r'|(-?(?:NaN|Inf(?:inity)?))', re.DOTALL)
# Bodies that may hold a decimal number too big for rapidjson: a positive exponent of
# three digits or more (past 308). Fraction digits never make a number too big; long
# integers go through _integer whatever the body.
_MAYBE_TOO_BIG = re.compile(r"[eE]\+?[0-9]{3}")
# Bodies whose doubles may differ from a correctly rounded parse: 16 digits in a row, or
# an exponent of two digits or more.
_INEXACT = re.compile(r"[0-9]{16}|[eE][-+]?[0-9]{2}")
_NAN_INF = re.compile(r"-NaN|Inf(?!inity)")
# A \u escape of a high surrogate not followed by one of a low surrogate, after an even
# number of backslashes (so the escape is not itself escaped).
_LONE_HIGH = re.compile(r"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})"
                        r"(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")
_POW10 = [float("1e%d" % n) for n in range(309)]  # rapidjson's Pow10 table


class JsonError(ValueError):
    """A body rapidjson would not parse: `message` as GetParseError_En says it, `offset`
    in bytes."""

    def __init__(self, message, offset):
        super().__init__("JSON Parse error: %s at offset: %d" % (message, offset))
        self.message, self.offset = message, offset


class _TooBig(Exception):
    def __init__(self, text):
        super().__init__(text)
        self.text = text


def parse(raw, object_pairs_hook=None, exact=False):
    """Body bytes -> Python value; JsonError as rapidjson reports it (the first problem
    in the text). Strings come back as str, undecodable bytes as surrogates
    (json_writer.to_bytes restores them)."""
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    if ("Inf" in text or "-NaN" in text) and _NAN_INF.search(text):
        text = _spell_out_nan_inf(text)
    lone = _LONE_HIGH.search(text) if "\\u" in text else None
    hooks = {"parse_int": _integer}
    if exact or _maybe_too_big(text):
        hooks = {"parse_int": _number, "parse_float": _number}
    try:
        value = json.loads(text, object_pairs_hook=object_pairs_hook, **hooks)
    except _TooBig as too_big:
        failure = JsonError(TOO_BIG, 0)
        failure.pos = _number_offset(text, too_big.text)
    except json.JSONDecodeError as error:
        if error.msg.startswith("Extra data") and text[error.pos] == "\0":
            # rapidjson reads a NUL after the document as its end
            return parse(text[:error.pos], object_pairs_hook, exact)
        failure = _decode_error(text, error)
        failure.pos = error.pos
    else:
        if lone:
            raise JsonError(SURROGATE, _byte_offset(text, lone.start(1)))
        return value
    if lone and lone.start(1) < failure.pos:
        raise JsonError(SURROGATE, _byte_offset(text, lone.start(1))) from None
    raise JsonError(failure.message, _byte_offset(text, failure.pos)) from None


def _maybe_too_big(text, scan_after=64):
    """Whether some exponent may pass rapidjson's limit: the letters e/E are found one by
    one (a body of numbers has few), the whole text scanned past `scan_after` of them."""
    for letter in "eE":
        position, seen = text.find(letter), 0
        while position != -1:
            seen += 1
            if seen > scan_after:
                return bool(_MAYBE_TOO_BIG.search(text))
            if _MAYBE_TOO_BIG.match(text, position):
                return True
            position = text.find(letter, position + 1)
    return False


def needs_exact(text_or_raw):
    """Whether the body holds numbers whose doubles rapidjson may compute differently."""
    text = text_or_raw.decode("latin-1") if isinstance(text_or_raw, bytes) else text_or_raw
    return bool(_INEXACT.search(text))


def _byte_offset(text, pos):
    return len(text[:pos].encode("utf-8", "surrogateescape"))


def _decode_error(text, error):
    """Python's JSONDecodeError -> rapidjson's message and offset."""
    message = next((ours for theirs, ours in _PARSE_ERRORS if error.msg.startswith(theirs)),
                   error.msg)
    if error.msg.startswith("Invalid control character") and text[error.pos:error.pos + 1] \
            == "\0":
        message = "Missing a closing quotation mark in string."
    if error.msg.startswith("Expecting ',' delimiter"):
        message = "Missing a comma or '%s' after %s." % (
            ("]", "an array element") if _in_array(text, error.pos) else
            ("}", "an object member"))
    return JsonError(message, _byte_offset(text, error.pos))


def _in_array(text, pos):
    """Whether position `pos` of a JSON text is inside an array rather than an object."""
    stack, in_string, escape = [], False, False
    for char in text[:pos]:
        if in_string:
            if escape:
                escape = False
            elif char == "\\":
                escape = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            stack.append(char)
        elif char in "]}" and stack:
            stack.pop()
    return bool(stack) and stack[-1] == "["


def _spell_out_nan_inf(text):
    """rapidjson's NaN / Inf spellings Python lacks (`Inf`, `-Inf`, `-NaN`) as the ones
    it has, outside strings."""
    def spell(match):
        token = match.group(2)
        if not token:
            return match.group(0)
        if token.endswith("NaN"):
            return "NaN"
        return "-Infinity" if token.startswith("-") else "Infinity"
    return _TOKENS.sub(spell, text)


def _number_offset(text, number):
    """Where the first number spelled `number` outside strings starts."""
    for match in _TOKENS.finditer(text):
        if match.group(1) == number:
            return match.start(1)
    return 0


def _integer(text):
    """A JSON integer: Python's int while it fits int64 or uint64 (19 digits always do),
    else rapidjson's double (or too big)."""
    if len(text) < 20:
        return int(text)
    return _number(text)


def _number(text):
    """A JSON number's text -> int or float as rapidjson 1.1.0's ParseNumber (normal
    precision) reads it; _TooBig where it reports kParseErrorNumberTooBig."""
    size, pos = len(text), 0
    minus = text[0] == "-"
    pos = 1 if minus else 0
    small, big, use64, digits = 0, 0, False, 0
    if text[pos] == "0":
        pos += 1
    else:
        small = ord(text[pos]) - 48
        pos += 1
        limit, last = (214748364, "8") if minus else (429496729, "5")
        while pos < size and "0" <= text[pos] <= "9":
            if small >= limit and (small != limit or text[pos] > last):
                big, use64 = small, True
                break
            small = small * 10 + ord(text[pos]) - 48
            digits += 1
            pos += 1
    use_double, value = False, 0.0
    if use64:
        limit, last = (0x0CCCCCCCCCCCCCCC, "8") if minus else (0x1999999999999999, "5")
        while pos < size and "0" <= text[pos] <= "9":
            if big >= limit and (big != limit or text[pos] > last):
                value, use_double = float(big), True
                break
            big = big * 10 + ord(text[pos]) - 48
            digits += 1
            pos += 1
    if use_double:
        while pos < size and "0" <= text[pos] <= "9":
            if value >= 1.7976931348623157e307:
                raise _TooBig(text)
            value = value * 10 + (ord(text[pos]) - 48)
            pos += 1
    exp_frac = 0
    if pos < size and text[pos] == ".":
        pos += 1
        if not use_double:
            if not use64:
                big = small
            while pos < size and "0" <= text[pos] <= "9":
                if big > 0x1FFFFFFFFFFFFF:
                    break
                big = big * 10 + ord(text[pos]) - 48
                exp_frac -= 1
                if big:
                    digits += 1
                pos += 1
            value, use_double = float(big), True
        while pos < size and "0" <= text[pos] <= "9":
            if digits < 17:
                value = value * 10.0 + (ord(text[pos]) - 48)
                exp_frac -= 1
                if value > 0.0:
                    digits += 1
            pos += 1
    exp = 0
    if pos < size and text[pos] in "eE":
        pos += 1
        if not use_double:
            value, use_double = float(big if use64 else small), True
        negative = text[pos] == "-"
        if text[pos] in "+-":
            pos += 1
        exp = ord(text[pos]) - 48
        pos += 1
        most = 308 - exp_frac
        while pos < size and "0" <= text[pos] <= "9":
            exp = exp * 10 + ord(text[pos]) - 48
            pos += 1
            if negative and exp >= 214748364:
                break  # rapidjson skips the rest of the exponent's digits
            if not negative and exp > most:
                raise _TooBig(text)
        if negative:
            exp = -exp
    if use_double:
        value = _strtod_normal(value, exp + exp_frac)
        return -value if minus else value
    if use64:
        return -big if minus else big
    return -small if minus else small


def _fast_path(significand, exp):
    if exp < -308:
        return 0.0
    if exp >= 0:
        return significand * _POW10[exp]
    return significand / _POW10[-exp]


def _strtod_normal(value, exp):
    if exp < -308:
        return _fast_path(_fast_path(value, -308), exp + 308)
    return _fast_path(value, exp)

