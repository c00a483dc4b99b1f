"""REST answers as TF Serving 2.15.1 writes them, byte for byte: the examples of its
api_rest.md that concern half_plus_two / half_plus_three (compared as parsed JSON with
the documented body, and byte for byte with what TF Serving's writers produce: rapidjson's
PrettyWriter as util/json_tensor.cc drives it, protobuf's C++ printer for status and
metadata), float formatting, classify without a classes output, and a failed load's code.

api_rest.md shows the model status bytes exactly as TF Serving prints them. Its predict
and regress bodies are tidied: TF Serving opens the row-format `predictions` array before
switching rapidjson to single-line arrays and switches back before closing it, so the
closing bracket sits on its own line; the tests hold the server to those real bytes."""
import json
import shutil
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc

from slimserve.serving.api import json_writer
from slimserve.serving.config import model_config
from slimserve.testing import half_plus_two
from slimserve.testing.servers import serve_in_process, wait_until

# api_rest.md, "Make REST API calls to ModelServer": the status call, printed bytes.
DOC_STATUS = b"""{
 "model_version_status": [
  {
   "version": "123",
   "state": "AVAILABLE",
   "status": {
    "error_code": "OK",
    "error_message": ""
   }
  }
 ]
}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_rest")
    half_plus_two.write_half_plus(str(root / "half_plus_two"))
    half_plus_two.write_half_plus(str(root / "three"), plus=3.0)
    server = serve_in_process([
        model_config.ServedModel("half_plus_two", str(root / "half_plus_two")),
        model_config.ServedModel("saved_model_half_plus_three", str(root / "three"))])
    yield server
    server.stop()


def _call(server, path, body=None):
    url = "http://127.0.0.1:%d%s" % (server.rest_api_port, path)
    data = body.encode() if isinstance(body, str) else body
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type"), error.read()


def test_api_rest_md_status_example_byte_for_byte(server):
    status, content_type, body = _call(server, "/v1/models/saved_model_half_plus_three")
    assert (status, content_type) == (200, "application/json")
    assert body == DOC_STATUS


def test_api_rest_md_predict_example(server):
    status, _, body = _call(server, "/v1/models/saved_model_half_plus_three:predict",
                            '{"instances": [1.0,2.0,5.0]}')
    assert status == 200
    assert json.loads(body) == {"predictions": [3.5, 4.0, 5.5]}
    assert body == b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


def test_api_rest_md_regress_example(server):
    status, _, body = _call(
        server, "/v1/models/saved_model_half_plus_three:regress",
        '{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, '
        '{"x": 2.0}]}')
    assert status == 200
    assert json.loads(body) == {"results": [3.5, 4.0]}
    assert body == b'{\n    "results": [3.5, 4.0]\n}'


def test_api_rest_md_error_example(server, caplog):
    """api_rest.md's body byte for byte: which models the server does serve is a hint for
    its log only (any client could read the list otherwise; --error_hints adds it)."""
    status, content_type, body = _call(server, "/v1/models/half:predict",
                                       '{"instances": [1.0,5.0]}')
    assert (status, content_type) == (404, "application/json")
    assert json.loads(body) == {"error": "Servable not found for request: Latest(half)"}
    assert body == b'{\n    "error": "Servable not found for request: Latest(half)"\n}'
    assert any("'half', which this server does not serve (this server serves models "
               "half_plus_two, saved_model_half_plus_three)" in r.getMessage()
               for r in caplog.records)


def test_row_columnar_and_scalar_layouts(server):
    cases = [
        ('{"instances": [[1.0, 2.0], [3.0, 4.0]]}',
         b'{\n    "predictions": [[2.5, 3.0], [3.5, 4.0]\n    ]\n}'),
        ('{"inputs": [1.0, 3.0]}',
         b'{\n    "outputs": [\n        2.5,\n        3.5\n    ]\n}'),
        ('{"inputs": 1.0}', b'{\n    "outputs": 2.5\n}'),
        ('{"inputs": [[]]}', b'{\n    "outputs": [\n        []\n    ]\n}'),
    ]
    for request, expected in cases:
        status, _, body = _call(server, "/v1/models/half_plus_two:predict", request)
        assert (status, body) == (200, expected), (request, body)


def test_classify_without_classes_output_labels_empty(server):
    """TF Serving's testClassifyREST: classify_x_to_y has scores only."""
    status, _, body = _call(server, "/v1/models/half_plus_two:classify",
                            '{"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}, '
                            '{"x": 4.0}]}')
    assert status == 200
    assert json.loads(body) == {"results": [[["", 3.0]], [["", 4.0]]]}
    assert body == b'{\n    "results": [[["", 3.0]], [["", 4.0]]\n    ]\n}'


@pytest.mark.parametrize("values, expected", [
    # absl::StrCat's six significant digits; 9 (float) when they do not round-trip.
    ([9000000, 999999, 0.5, 0.0003, 0.00003, 555557.5], [
        "9e+06", "999999.0", "0.5", "0.0003", "3e-05", "555557.5"]),
    # 1e-45 is float32's smallest denormal: six digits already read back as it.
    ([0.1, 1 / 3, 16777217, 1e-45], ["0.1", "0.333333343", "16777216.0", "1.4013e-45"]),
    ([np.nan, np.inf, -np.inf, -0.0], ["NaN", "Infinity", "-Infinity", "-0.0"]),
])
def test_float_formatting_is_tf_servings(values, expected):
    assert json_writer.decimals(np.array(values, np.float32)) == expected


def test_strings_and_bytes_outputs_are_written_as_rapidjson_writes_them():
    outputs = {"text": np.array([b'a"\\\x01\xff', "é".encode()], object),
               "image_bytes": np.array([b"\x00\x01"], object)}
    columnar = json_writer.predictions(outputs, False).encode("utf-8", "surrogateescape")
    # Invalid UTF-8 passes through; control characters as \u00XX; _bytes outputs as b64.
    assert b'"a\\"\\\\\\u0001\xff"' in columnar
    assert b'"b64": "AAE="' in columnar


def test_failed_load_reports_the_load_errors_own_code(tmp_path):
    """A version whose saved_model.pb does not parse fails with DATA_LOSS (TF Serving's
    "Can't parse ... as binary proto"), and GetModelStatus reports that code, on gRPC and
    REST, not UNKNOWN."""
    base = tmp_path / "broken"
    good = half_plus_two.write_half_plus(str(base))
    server = serve_in_process([model_config.ServedModel("broken", str(base))],
                              max_num_load_retries=0, file_system_poll_wait_seconds=0.2)
    try:
        # newer, with a corrupt graph, published whole once serving (a server started
        # with it as its latest exits, as TF Serving's does)
        shutil.copytree(good, base / "partial")
        (base / "partial" / "saved_model.pb").write_bytes(b"\xff" * 64)
        (base / "partial").rename(base / "00000124")
        channel = grpc.insecure_channel("127.0.0.1:%d" % server.port)
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "broken"
        request.model_spec.version.value = 124

        def error_code():
            try:
                return stub.GetModelStatus(request, timeout=30) \
                    .model_version_status[0].status.error_code
            except grpc.RpcError:  # NOT_FOUND until the poll sees version 124
                return 0

        status = wait_until(error_code, 60, message="version 124 to fail")
        assert status == grpc.StatusCode.DATA_LOSS.value[0]
        code, _, body = _call(server, "/v1/models/broken/versions/124")
        entry = json.loads(body)["model_version_status"][0]
        assert (code, entry["state"], entry["status"]["error_code"]) == (200, "END",
                                                                         "DATA_LOSS")
        assert entry["status"]["error_message"]
        channel.close()
    finally:
        server.stop()


def test_paths_outside_the_api_get_tf_servings_404_page(server):
    status, content_type, body = _call(server, "/v2/nothing")
    assert status == 404 and content_type.startswith("text/html")
    assert b"<TITLE>404 Not Found</TITLE>" in body
