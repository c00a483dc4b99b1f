"""serving/core/admission.py: the bytes of requests in flight are bounded before anything
of a request is decoded, whatever the CPU's speed. In process; the socket-level check
(six 30 MiB logged Predicts against a capped server) is in
tests/test_request_log_durability.py."""
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from slimserve.serving.core import admission
from slimserve.serving.core import errors
from slimserve.serving.config import model_config
from slimserve.testing import tiny_models
from slimserve.testing.inprocess import Aborted, Context, InProcess
from tests.helpers import ROOT


def test_requests_are_charged_their_footprint_and_refused_past_the_budget():
    budget = admission.BytesInFlight(10 * admission.FOOTPRINT * 1000)
    first = budget.acquire(6000)
    assert budget.used == admission.FOOTPRINT * 6000
    with pytest.raises(errors.ServingError) as caught:
        budget.acquire(5000)
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry later" in caught.value.message and budget.refused == 1
    assert budget.used == admission.FOOTPRINT * 6000  # a refusal takes nothing
    budget.release(first)
    second = budget.acquire(5000)  # fits once the first is answered
    budget.release(second)
    assert budget.used == 0
    with pytest.raises(errors.ServingError) as caught:
        budget.acquire(11000)  # more than the whole budget: never servable
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max_request_bytes_in_flight" in caught.value.message


def test_the_default_budget_is_a_share_of_the_headroom_under_an_address_space_cap():
    """A child under `prlimit --as` 3 GiB derives a budget from what the cap leaves it."""
    code = ("from slimserve.serving.core import admission\n"
            "print(admission.memory_headroom(), admission.default_budget())")
    capped = subprocess.run(["prlimit", "--as=%d" % (3 << 30), sys.executable, "-c", code],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    headroom, budget = map(int, capped.stdout.split())
    assert 0 < headroom < 3 << 30
    assert budget == max(admission.MIN_BUDGET, int(headroom * admission.SHARE))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The serving stack in process with a 1 MiB budget (4 MiB charged x 4)."""
    base = str(tmp_path_factory.mktemp("tiny") / "tiny")
    tiny_models.write_tiny_model(base, 1)
    with InProcess([model_config.ServedModel("tiny", base)],
                   in_flight=admission.BytesInFlight(admission.FOOTPRINT << 20)) as served:
        yield served


def _predict_request(rows):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([rows, 2], np.float32)))
    return request


def test_grpc_and_rest_answer_past_the_budget_at_once_and_serve_after(stack):
    """With 1020 KiB (of 1 MiB) held by a request in flight, a 16 KiB Predict (gRPC) and a REST
    predict are RESOURCE_EXHAUSTED / 429 and counted as such; once it is answered the
    same requests are served and the budget is whole again."""
    in_flight = stack.service.in_flight
    request = _predict_request(2 << 10)
    body = {"instances": [[1.0, 2.0]] * 2000}
    held = in_flight.acquire(1020 << 10)
    try:
        with pytest.raises(Aborted) as caught:
            stack.prediction.Predict(request, Context())
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details
        status, answer = stack.rest_json("POST", "/v1/models/tiny:predict", body)
        assert status == 429 and "--max_request_bytes_in_flight" in answer["error"]
    finally:
        in_flight.release(held)
    response = stack.prediction.Predict(request, Context())
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["y"]).ravel(),
                               tiny_models.expected_y(np.ones([2 << 10, 2])), rtol=1e-6)
    assert stack.rest_json("POST", "/v1/models/tiny:predict", body)[0] == 200
    assert in_flight.used == 0 and in_flight.refused == 2
    refused = [line for line in stack.metrics.render().splitlines()
               if "request_count" in line and "RESOURCE_EXHAUSTED" in line]
    assert refused, "refusals are counted under their status"
