"""The REST routes as TF Serving 2.15.1's handler and its path parsing answer them: every
wire-observable expectation of model_servers/http_rest_api_handler_test.cc and
http_rest_api_util_test.cc, checked through slimserve's own routes in process (as those
tests drive HttpRestApiHandler against one ServerCore, with no HTTP).

The served model is half_plus_two at version 123 under TF Serving's test name, with a
version label; a second one has every reserved character in its name and label."""
import json
import urllib.parse

import pytest

from slimserve.serving.config.model_config import ServedModel
from slimserve.serving.core.version_policy import VersionPolicy
from slimserve.testing import half_plus_two
from slimserve.testing.inprocess import InProcess

MODEL = "saved_model_half_plus_two_2_versions"
LABEL = "Version_Label"
RESERVED = "!#$%&'()*+,/:;=?@[]"
ODD_NAME, ODD_LABEL = "modelname" + RESERVED, "latest" + RESERVED


def _quote(text):
    return urllib.parse.quote(text, safe="")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("handler")
    base = str(root / "half_plus_two")
    half_plus_two.write_half_plus(base)
    with InProcess([
            ServedModel(MODEL, base, VersionPolicy("specific", versions=[123]),
                        labels={LABEL: 123}),
            ServedModel(ODD_NAME, base, labels={ODD_LABEL: 123})]) as instance:
        yield instance


def _error(stack, method, path, body=None):
    """(HTTP status, the error message) of a call that must fail."""
    status, headers, payload = stack.rest(method, path, body)
    assert ("Content-Type", "application/json") in headers
    assert status != 200, payload
    return status, json.loads(payload)["error"]


@pytest.mark.parametrize("method, path, text", [
    ("GET", "/v1/foo", "Malformed request"),
    ("POST", "/v1/foo", "Malformed request"),
    ("GET", "/v1/models", "Missing model name"),
    ("GET", "/v1/models/debug/model_name", "Malformed request"),
    ("POST", "/v1/models", "Malformed request"),
    ("GET", "/v1/models/foo:predict", "Malformed request"),
    ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
    ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/%d:regress" % (2 ** 64 - 1),
     "Failed to convert version"),
    ("POST", "/v1/models/foo/metadata", "Malformed request"),
    ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
    # the path TF Serving matches is evhttp's path with `?query`, so a query breaks it
    ("POST", "/v1/models/%s:predict?debug=1" % MODEL, "Malformed request"),
    # RE2's \d is ASCII: other digits are no version
    ("POST", "/v1/models/foo/versions/\u0661\u0662:predict", "Malformed request"),
])
def test_unsupported_api_calls_are_invalid_argument(stack, method, path, text):
    status, message = _error(stack, method, path, {"instances": [1.0]})
    assert status == 400 and text in message
    if text == "Malformed request":
        assert message == "Malformed request: %s %s" % (method, path)


def test_a_query_becomes_part_of_the_model_name_on_get(stack):
    """The status pattern's name takes anything but `/` and `:`, so TF Serving looks up a
    model named `name?x`."""
    status, message = _error(stack, "GET", "/v1/models/%s?x" % MODEL)
    assert (status, message) == (404, "Could not find any versions of model %s?x" % MODEL)


def test_unknown_model_and_version_are_not_found_with_tf_servings_words(stack):
    cases = [("/v1/models/foo:predict", "Latest(foo)"),
             ("/v1/models/foo/versions/50:predict", "Specific(foo, 50)"),
             ("/v1/models/%s99:predict" % MODEL, "Latest(%s99)" % MODEL),
             ("/v1/models/%s/versions/99:predict" % MODEL, "Specific(%s, 99)" % MODEL),
             ("/v1/models/foo/versions/99/metadata", "Specific(foo, 99)")]
    for path, request in cases:
        method = "GET" if path.endswith("metadata") else "POST"
        status, headers, payload = stack.rest(method, path, {"instances": [1]})
        assert status == 404
        assert payload == b'{\n    "error": "Servable not found for request: %s"\n}' % (
            request.encode())


@pytest.mark.parametrize("model", ["nope", MODEL])
def test_a_label_is_resolved_first_and_decoded(stack, model):
    """ServerCore resolves a label before it looks the model up: an unknown label (of a
    served model or of one the server does not know) is INVALID_ARGUMENT, with the label
    percent-decoded as DecodeArg decodes it. (:classify and :regress read their JSON
    first, as TF Serving's handler does.)"""
    for verb in (":predict", ":regress", ":classify", "/metadata"):
        path = "/v1/models/%s/labels/%s%s" % (model, _quote(ODD_LABEL), verb)
        status, headers, payload = stack.rest("GET" if verb == "/metadata" else "POST", path,
                                              {"instances": ["x", "y"],
                                               "examples": [{"x": 1.0}]})
        assert status == 400, (path, payload)
        assert payload == (b'{\n    "error": "Unrecognized servable version label: '
                           + ODD_LABEL.encode() + b'"\n}')


def test_predict_request_errors(stack):
    path = "/v1/models/%s:predict" % MODEL
    assert _error(stack, "POST", path, b"") == (400, "JSON Parse error: The document is empty")
    status, message = _error(stack, "POST", path, b"instances = [1, 2]")
    assert status == 400 and message.startswith("JSON Parse error: Invalid value")
    status, message = _error(stack, "POST", path, {"instances": ["x", "y"]})
    assert status == 400 and message.endswith("not of expected type: float")
    status, message = _error(stack, "POST", path.replace(
        ":predict", "/labels/Version_Nonexistent:predict"), {"instances": ["x", "y"]})
    assert (status, message) == (400, "Unrecognized servable version label: "
                                      "Version_Nonexistent")
    status, message = _error(stack, "POST", path, {"signature_name": 100})
    assert status == 400 and message.endswith(
        "'signature_name' key must be a string value.")


@pytest.mark.parametrize("route", ["", "/versions/123", "/labels/" + LABEL])
def test_predict_regress_classify_answers(stack, route):
    def call(verb, body):
        status, headers, payload = stack.rest(
            "POST", "/v1/models/%s%s:%s" % (MODEL, route, verb), body)
        assert status == 200 and headers == [("Content-Type", "application/json")], payload
        return json.loads(payload)

    assert call("predict", {"instances": [[1.0, 2.0], [3.0, 4.0]]}) == {
        "predictions": [[2.5, 3.0], [3.5, 4.0]]}
    assert call("predict", {"instances": [1.0, 2.0]}) == {"predictions": [2.5, 3.0]}
    assert call("predict", {"signature_name": "serving_default",
                            "instances": [3.0, 4.0]}) == {"predictions": [3.5, 4.0]}
    assert call("predict", {"signature_name": "serving_default",
                            "inputs": [3.0, 4.0]}) == {"outputs": [3.5, 4.0]}
    assert call("regress", {"signature_name": "regress_x_to_y",
                            "examples": [{"x": 80.0}]}) == {"results": [42.0]}
    assert call("classify", {"signature_name": "classify_x_to_y",
                             "examples": [{"x": 20.0}]}) == {"results": [[["", 12.0]]]}


@pytest.mark.parametrize("route", ["", "/versions/123", "/labels/" + LABEL])
def test_model_status(stack, route):
    status, headers, payload = stack.rest("GET", "/v1/models/%s%s" % (MODEL, route))
    assert status == 200 and headers == [("Content-Type", "application/json")]
    assert payload == (b'{\n "model_version_status": [\n  {\n   "version": "123",\n'
                       b'   "state": "AVAILABLE",\n   "status": {\n    "error_code": "OK",\n'
                       b'    "error_message": ""\n   }\n  }\n ]\n}\n')


def test_reserved_characters_in_names_and_labels_are_decoded(stack):
    """http_rest_api_util_test's paths: a model name and a label holding every reserved
    character, percent-encoded, on GET and POST."""
    name, label = _quote(ODD_NAME), _quote(ODD_LABEL)
    for path in ("/v1/models/%s" % name, "/v1/models/%s/versions/123" % name,
                 "/v1/models/%s/labels/%s" % (name, label)):
        status, _, payload = stack.rest("GET", path)
        assert status == 200 and json.loads(payload)["model_version_status"][0][
            "version"] == "123"
    for path in ("/v1/models/%s/labels/%s/metadata" % (name, label),
                 "/v1/models/%s/metadata" % name):
        status, _, payload = stack.rest("GET", path)
        assert status == 200
        assert json.loads(payload)["model_spec"] == {"name": ODD_NAME, "signature_name": "",
                                                     "version": "123"}
    for path in ("/v1/models/%s:predict" % name,
                 "/v1/models/%s/labels/%s:predict" % (name, label),
                 "/v1/models/%s/versions/99:predict" % name):
        status, _, payload = stack.rest("POST", path, {"instances": [1.0]})
        if "99" in path:
            assert status == 404 and json.loads(payload)["error"] == (
                "Servable not found for request: Specific(%s, 99)" % ODD_NAME)
        else:
            assert (status, json.loads(payload)) == (200, {"predictions": [2.5]})


def test_undecodable_bytes_in_a_name_come_back_as_they_were(stack):
    """DecodeArg hands TF Serving the name's bytes, UTF-8 or not; its error says them."""
    status, _, payload = stack.rest("POST", "/v1/models/caf%E9:predict", {"instances": [1]})
    assert status == 404
    assert payload == b'{\n    "error": "Servable not found for request: Latest(caf\xe9)"\n}'
    status, _, payload = stack.rest("POST", "/v1/models/caf%C3%A9+1:predict",
                                    {"instances": [1]})
    assert payload == ('{\n    "error": "Servable not found for request: Latest(caf\u00e9+1)"'
                       '\n}').encode()
