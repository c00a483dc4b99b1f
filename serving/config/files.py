"""The one reader of TF Serving's text-format config files.

Every `--*_file` flag (model config, batching parameters, platform config, thread pool
factory config, monitoring, SSL, session config) is read here, once, by protobuf's own text_format into TF Serving's message, so a file the
real tensorflow_model_server accepts parses the same way and a bad one fails the same way:
with TF Serving's wording (`Error parsing text-format tensorflow.serving.ModelServerConfig:
1:1: ...`, what its log shows and what log matching looks for), behind the flag and the file
at fault. Files are bounded in size before they are read.
"""
from google.protobuf import text_format
from tensorflow.core.protobuf import config_pb2
from tensorflow_serving.config import model_server_config_pb2

from slimserve import errors
from slimserve.serving.config import messages

# No TF Serving config is anywhere near this; a larger file is refused before it is read.
MAX_CONFIG_BYTES = 64 << 20


class ConfigError(errors.UserError):
    """A config (a file, or a message in process) that cannot be read, parsed or served;
    the message names the flag, the file and why. A UserError: the user can fix it."""


def parse_text(text, message_class, where):
    """Text-format `text` -> a new `message_class`; `where` names the source in errors."""
    message = message_class()
    try:
        # the message's own pool resolves the type of an expanded Any ([type.googleapis.com/
        # tensorflow.serving.SavedModelBundleSourceAdapterConfig] { ... })
        text_format.Parse(text, message, descriptor_pool=message_class.DESCRIPTOR.file.pool)
    except text_format.ParseError as error:
        position = ""
        if error.GetLine() is not None:
            position = "%d:%d: " % (error.GetLine(), error.GetColumn() or 0)
        detail = str(error).split(" : ", 1)[-1] if " : " in str(error) else str(error)
        raise ConfigError("%s: Error parsing text-format %s: %s%s" % (
            where, message_class.DESCRIPTOR.full_name, position, detail)) from None
    return message


def read_text(path, message_class, flag):
    """The text-format file at `path` (given by --`flag`) as a `message_class`."""
    where = "--%s %s" % (flag, path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError("%s: %s" % (where, error.strerror or error)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("%s: larger than %d bytes; not a TF Serving config file"
                          % (where, MAX_CONFIG_BYTES))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError("%s: not UTF-8 text (%s)" % (where, error)) from None
    return parse_text(text, message_class, where)


def _reader(message_class, default_flag):
    """read_text for one config message, named after its flag by default."""
    def read(path, flag=default_flag):
        return read_text(path, message_class, flag)
    return read


read_model_server_config = _reader(model_server_config_pb2.ModelServerConfig,
                                   "model_config_file")
read_batching_parameters = _reader(messages.BatchingParameters, "batching_parameters_file")
read_platform_config = _reader(messages.PlatformConfigMap, "platform_config_file")
read_thread_pool_factory_config = _reader(messages.ThreadPoolFactoryConfig,
                                          "thread_pool_factory_config_file")
read_monitoring_config = _reader(messages.MonitoringConfig, "monitoring_config_file")
read_ssl_config = _reader(messages.SSLConfig, "ssl_config_file")
read_session_config = _reader(config_pb2.ConfigProto, "tensorflow_session_config_file")
