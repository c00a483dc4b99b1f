"""Every number of every config file and flag has a bound, checked once before use:
0, -1, 2^31, 2^63-1 (and NaN where a float is read) thrown at each field either stop
the server at start with a message naming the file (or flag) and the field, or give a
start that serves. serving/config/bounds.py holds the files' rules, the option objects'
fields the flags'; docs/reliability.md's table is checked against both.

A model config change with a number out of bounds is kept out on reload, the old config
serving; the thread-pool config that crashed TensorFlow at the first load is refused."""
import math
import os

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor
from google.protobuf import text_format
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.config import model_server_config_pb2

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.serving import options as options_lib
from slimserve.serving import server as server_lib
from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.testing import tiny_models
from slimserve.testing.inprocess import Context
from tests.helpers import ROOT

VALUES = (0, -1, 2 ** 31, 2 ** 63 - 1)
_F = descriptor.FieldDescriptor
_FLOATS = (_F.TYPE_FLOAT, _F.TYPE_DOUBLE)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("bounds") / "tiny")
    tiny_models.write_tiny_model(base, 1)
    return base


# --- every field has a rule, and the docs show them ----------------------------------------

@pytest.mark.parametrize("flag, root", bounds.roots(), ids=[f for f, _ in bounds.roots()])
def test_every_numeric_field_of_every_config_file_has_a_rule(flag, root):
    missing = [path for path, message, field in bounds.numeric_fields(root)
               if bounds.rule_of(message, field) is None]
    assert not missing, "%s: no bound for %s" % (flag, missing)


def test_every_numeric_flag_has_a_bound():
    unbounded = [f.name for _, f in fields.walk(options_lib.ServerOptions)
                 if f.metadata["kind"] in (int, float) and f.metadata.get("bound") is None]
    assert not unbounded


def test_reliability_md_shows_the_bounds_the_code_checks():
    text = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    assert bounds.table() in text
    for flag, rule in fields.bounds_table(options_lib.ServerOptions):
        assert "| `--%s` | %s |" % (flag, rule) in text, flag


# --- the files: 0, -1, 2^31, 2^63-1 and NaN at every field ---------------------------------

def _field_text(descriptor_, path, value):
    """Text format setting `path` (dotted, from bounds.numeric_fields) of a message of
    type `descriptor_` to `value`."""
    name, _, rest = path.partition(".")
    field = descriptor_.fields_by_name[name.replace("[]", "")]
    literal = ("nan" if isinstance(value, float) and math.isnan(value) else repr(value))
    if field.type == _F.TYPE_MESSAGE:
        message = field.message_type
        if message.GetOptions().map_entry:
            key, item = message.fields_by_name["key"], message.fields_by_name["value"]
            if rest:
                return '%s { key: "k" value { %s } }' % (name, _field_text(
                    item.message_type, rest, value))
            if key.type == _F.TYPE_STRING:
                return '%s { key: "CPU" value: %s }' % (name, literal)
            return '%s { key: %s value: "x" }' % (name, literal)
        if message.full_name in bounds.WRAPPERS:
            return "%s { value: %s }" % (name, literal)
        return "%s { %s }" % (name, _field_text(message, rest, value))
    return "%s: %s" % (name, literal)


def _values(descriptor_, path):
    """The values thrown at one field: NaN too where the field holds a float."""
    message = descriptor_
    field = None
    for name in path.split("."):
        field = message.fields_by_name[name.replace("[]", "")]
        if field.type == _F.TYPE_MESSAGE:
            message = field.message_type
            if message.GetOptions().map_entry:
                field = message.fields_by_name["value"]
                message = field.message_type if field.type == _F.TYPE_MESSAGE else message
            elif message.full_name in bounds.WRAPPERS:
                field = message.fields_by_name["value"]
    floats = field is not None and field.type in _FLOATS
    return VALUES + ((float("nan"),) if floats else ())


def _cases():
    """(flag, root descriptor, field path, value) for every numeric field that has a
    bound (NOT_READ ones are never read, refused and delegated ones have their own
    tests)."""
    found = []
    for flag, root in bounds.roots():
        for path, message, field in bounds.numeric_fields(root):
            rule = bounds.RULES.get(message)
            if not isinstance(rule, dict) or not isinstance(
                    rule.get(field), (fields.Bound, bounds.KeyedBound)):
                continue
            for value in _values(root, path):
                found.append((flag, root, path, value))
    return found


CASES = _cases()
MODEL_CONFIG = ('model_config_list { config { name: "tiny" base_path: "%s" '
                'model_platform: "tensorflow" %s } }')
PLATFORM = ('platform_configs { key: "tensorflow" value { source_adapter_config { '
            '[type.googleapis.com/tensorflow.serving.SavedModelBundleSourceAdapterConfig] '
            '{ legacy_config { %s } } } } }')
POOL = ("thread_pool_factory_config { [type.googleapis.com/tensorflow.ThreadPoolOptionProto]"
        " { %s } }")


def _file(tmp_path, tiny_base, flag, root, path, value):
    """The config file (text) and the ServerOptions fields that serve tiny with it."""
    body = _field_text(root, path, value)
    name = flag.lstrip("-")
    if flag == "--model_config_file":
        body = body[len("model_config_list { config { "):-len(" } }")]
        text, changes = MODEL_CONFIG % (tiny_base, body), {}
    elif flag == "--platform_config_file":
        text, changes = PLATFORM % body, {"model_base_path": tiny_base, "model_name": "tiny"}
    elif flag == "--thread_pool_factory_config_file":
        text, changes = POOL % body, {"model_base_path": tiny_base, "model_name": "tiny"}
    else:
        text, changes = body, {"model_base_path": tiny_base, "model_name": "tiny"}
    config = tmp_path / (name + ".config")
    config.write_text(text)
    changes[name] = str(config)
    return changes


def _bound(root, path):
    """The Bound a value at `path` meets (a map's is the one of key "CPU", the key
    _field_text writes)."""
    message, field = dict((p, (m, f)) for p, m, f in bounds.numeric_fields(root))[path]
    rule = bounds.RULES[message][field]
    return rule.bound_for("CPU") if isinstance(rule, bounds.KeyedBound) else rule


def _verdict(tmp_path, tiny_base, flag, root, path, value):
    """None when the server accepts the value, else the UserError's message (a parse
    error or a bound): both are clean refusals at start."""
    changes = _file(tmp_path, tiny_base, flag, root, path, value)
    options = options_lib.ServerOptions(port=0, grpc_socket_path=str(tmp_path / "sock"),
                                        rest_api_port=0, **changes).check()
    try:
        if flag == "--model_config_file":
            server_lib._model_configs(options)  # pylint: disable=protected-access
        else:
            server_lib.manager_options(options, server_lib.platform.bundle_settings(options))
    except user_errors.UserError as error:
        return str(error)
    return None


@pytest.mark.parametrize("flag, root, path, value", CASES,
                         ids=["%s:%s=%r" % (c[0][2:], c[2], c[3]) for c in CASES])
def test_each_value_is_refused_naming_file_and_field_or_accepted(tmp_path, tiny_base, flag,
                                                                   root, path, value):
    refusal = _verdict(tmp_path, tiny_base, flag, root, path, value)
    bound = _bound(root, path)
    if refusal is None:
        assert bound.accepts(value), "%s=%r accepted outside %s" % (path, value, bound.rule)
        return
    assert "%s %s" % (flag, tmp_path) in refusal, refusal  # names the flag and the file
    leaf = path.rsplit(".", 1)[-1]
    if "Error parsing text-format" in refusal:  # out of the field's type: protobuf's words
        assert leaf in refusal or "out of range" in refusal.lower() or "Couldn't parse" in \
            refusal, refusal
    else:
        assert leaf in refusal and bound.rule in refusal, refusal
        assert not bound.accepts(value)


def _accepted_groups():
    """{(flag, value): [path]} of the values each file accepts: one server start serves
    them all at once."""
    groups = {}
    for flag, root, path, value in CASES:
        bound = _bound(root, path)
        if bound.accepts(value) and not (isinstance(value, float) and math.isnan(value)):
            # a label or a specific version names a version: each gets its own start
            kind = path.rsplit(".", 1)[-1] if path.endswith(("version_labels",
                                                              ".versions")) else ""
            groups.setdefault((flag, value, kind), []).append(path)
    return groups


GROUPS = _accepted_groups()


def _merged_text(root, paths, value):
    """Text format setting every path to value (sub-messages merged by protobuf)."""
    message = _message_class(root)()
    for path in paths:
        part = _message_class(root)()
        text_format.Parse(_field_text(root, path, value), part,
                          descriptor_pool=root.file.pool)
        message.MergeFrom(part)
    return text_format.MessageToString(message, descriptor_pool=root.file.pool)


def _message_class(root):
    from google.protobuf import message_factory  # pylint: disable=import-outside-toplevel
    return message_factory.GetMessageClass(root)


def _serves(server):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([1, 2], np.float32)))
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        stub = server_lib.grpc_service.prediction_service_pb2_grpc.PredictionServiceStub(
            channel)
        return stub.Predict(request, timeout=60).model_spec.version.value


@pytest.mark.parametrize("flag, value, kind", sorted(GROUPS),
                         ids=["%s=%r%s" % (f, v, ":" + k if k else "")
                              for f, v, k in sorted(GROUPS)])
def test_accepted_values_start_a_server_that_serves(tmp_path, tiny_base, flag, value, kind):
    """Every value a bound accepts starts a server that serves; a version label naming a
    version that is not there stops the start naming the config (as TF Serving), and a
    specific version that is not there leaves the model without a version (answered)."""
    root = dict(bounds.roots())[flag]
    paths = GROUPS[(flag, value, kind)]
    name = flag.lstrip("-")
    if flag == "--model_config_file":
        prefix = "model_config_list.config."
        entry_type = model_server_config_pb2.ModelConfig.DESCRIPTOR
        body = _merged_text(entry_type, [p[len(prefix):] for p in paths], value)
        config = model_server_config_pb2.ModelServerConfig()
        entry = config.model_config_list.config.add()
        text_format.Parse(body.replace("CPU", "stable"), entry)
        entry.name, entry.base_path, entry.model_platform = "tiny", tiny_base, "tensorflow"
        expect_version = None if entry.model_version_policy.WhichOneof(
            "policy_choice") == "specific" or entry.version_labels else 1
        (tmp_path / "m.config").write_text(text_format.MessageToString(config))
        changes = {"model_config_file": str(tmp_path / "m.config")}
    else:
        body = _merged_text(root, paths, value)
        wrapped = {"--platform_config_file": PLATFORM, "--thread_pool_factory_config_file":
                   POOL}.get(flag, "%s") % body
        (tmp_path / "f.config").write_text(wrapped)
        changes = {name: str(tmp_path / "f.config"), "model_base_path": tiny_base,
                   "model_name": "tiny"}
        expect_version = 1
    server = server_lib.ModelServer(port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                                    file_system_poll_wait_seconds=0, **changes)
    try:
        try:
            server.start()
        except user_errors.UserError as refused:
            assert kind == "version_labels" and value != 1, refused
            assert str(refused) == (
                "--model_config_file %s: Request to assign label stable to version %d of "
                "model tiny, which is not currently available for inference"
                % (tmp_path / "m.config", value))
            return
        except Exception as error:  # pylint: disable=broad-except
            pytest.fail("%s with %s=%r: the start failed: %r" % (flag, paths, value, error))
        assert kind != "version_labels"
        if expect_version is not None:
            assert _serves(server) == expect_version, (flag, paths, value)
        else:  # a specific version that is not there: no version, and it says so
            with pytest.raises(server_lib.errors.ServingError) as missing:
                server.service.status("tiny")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop()


# --- a reload out of bounds changes nothing; the thread pool that crashed -------------------

def test_a_reload_out_of_bounds_is_kept_out_and_the_old_config_serves(tiny_base, tmp_path):
    config_file = tmp_path / "models.config"
    config_file.write_text(MODEL_CONFIG % (tiny_base, ""))
    server = server_lib.ModelServer(model_config_file=str(config_file),
                                    port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                                    file_system_poll_wait_seconds=0).start()
    try:
        request = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(MODEL_CONFIG % (tiny_base, "model_version_policy { latest { "
                                                     "num_versions: 100000 } }"),
                          request.config)
        context = Context()
        response = server_lib.grpc_service.ModelServicer(
            server.service, server.reload_config).HandleReloadConfigRequest(request, context)
        assert context.code == grpc.StatusCode.INVALID_ARGUMENT
        assert response.status.error_message == (
            "ReloadConfigRequest: model_config_list.config[0].model_version_policy.latest."
            "num_versions must be in [0, 1024], got 100000")
        assert _serves(server) == 1
    finally:
        server.stop()


def test_a_thread_pool_of_100000_threads_is_refused_naming_file_and_field(tiny_base,
                                                                        tmp_path):
    path = tmp_path / "pool.config"
    path.write_text(POOL % "num_threads: 100000")
    with pytest.raises(user_errors.UserError) as refused:
        server_lib.ModelServer(model_base_path=tiny_base, model_name="tiny",
                               port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                               thread_pool_factory_config_file=str(path))
    assert str(refused.value) == (
        "--thread_pool_factory_config_file %s: thread_pool_factory_config: num_threads must "
        "be in [0, 4096], got 100000" % path)


def test_custom_graph_optimizers_are_refused(tiny_base, tmp_path):
    path = tmp_path / "session.config"
    path.write_text('graph_options { rewrite_options { custom_optimizers { name: "x" '
                    'parameter_map { key: "n" value { i: 9223372036854775807 } } } } }')
    with pytest.raises(files.ConfigError, match="custom_optimizers\\[0\\]: refused"):
        server_lib.ModelServer(model_base_path=tiny_base, model_name="tiny",
                               port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                               tensorflow_session_config_file=str(path))


@pytest.mark.parametrize("value", ["2147483648", "9223372036854775807", "-2147483649"])
def test_grpc_channel_argument_integers_are_32_bit(tiny_base, value):
    with pytest.raises(user_errors.UserError, match="--grpc_channel_arguments: "
                       "grpc.max_concurrent_streams=%s must be in" % value):
        server_lib.ModelServer(model_base_path=tiny_base, model_name="tiny",
                               port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                               grpc_channel_arguments="grpc.max_concurrent_streams=" + value)


# --- the flags: 0, -1, 2^31, 2^63-1 (and NaN) at every numeric flag ---------------------------

FLAGS = [f for _, f in fields.walk(options_lib.ServerOptions)
         if f.metadata["kind"] in (int, float)]
FLAG_CASES = [(f.name, v) for f in FLAGS
              for v in VALUES + ((float("nan"),) if f.metadata["kind"] is float else ())]


@pytest.mark.parametrize("name, value", FLAG_CASES, ids=["%s=%r" % c for c in FLAG_CASES])
def test_each_flag_value_is_refused_naming_the_flag_or_accepted(tiny_base, name, value):
    bound = options_lib.ServerOptions.__dataclass_fields__[name].metadata["bound"]
    options = options_lib.ServerOptions(model_base_path=tiny_base, model_name="tiny")
    options = options.replace(**{name: value})
    if bound.accepts(value):
        try:
            options.check()
        except user_errors.UserError as refused:  # a combination TF Serving refuses too
            assert "--" + name in str(refused), refused
        return
    with pytest.raises(user_errors.UserError) as refused:
        options.check()
    assert str(refused.value).startswith("--%s must be %s, got" % (name, bound.rule))


def _flag_groups():
    groups = {}
    for name, value in FLAG_CASES:
        bound = options_lib.ServerOptions.__dataclass_fields__[name].metadata["bound"]
        if name in ("port", "rest_api_port") or not bound.accepts(value):
            continue
        groups.setdefault(value, []).append(name)
    return groups


FLAG_GROUPS = _flag_groups()


@pytest.mark.parametrize("value", sorted(FLAG_GROUPS))
def test_accepted_flag_values_start_a_server_that_serves(tiny_base, value):
    changes = {name: value for name in FLAG_GROUPS[value]}
    if changes.get("tensorflow_session_parallelism") and (
            changes.get("tensorflow_intra_op_parallelism") and
            changes.get("tensorflow_inter_op_parallelism")):
        del changes["tensorflow_session_parallelism"]  # all three is TF Serving's error
    server = server_lib.ModelServer(model_base_path=tiny_base, model_name="tiny",
                                    port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                                    **changes)
    try:
        server.start()
        assert _serves(server) == 1, changes
    finally:
        server.stop()
