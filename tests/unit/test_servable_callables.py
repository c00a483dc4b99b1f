"""Servable.run's cached Session callables answer exactly as session.run with a feed
dict does, convert feeds as it did (shapes are left to the graph, as in C++), and belong
to one loaded version."""
import grpc
import numpy as np
import pytest

from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.testing import tiny_models

ROWS = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The tiny model loaded twice: through callables and through session.run."""
    path = tiny_models.write_tiny_model(str(tmp_path_factory.mktemp("callables") / "tiny"))
    fast = servable_lib.Servable("tiny", 1, path)
    plain = servable_lib.Servable("tiny", 1, path, use_callables=False)
    yield fast, plain
    fast.retire()
    plain.retire()


def test_callables_answer_as_session_run(tiny_pair):
    fast, plain = tiny_pair
    _, predict = fast.signature("serving_default")
    for keys in (["y"], ["doubled"], ["doubled", "y"]):
        for _ in range(2):  # the second call takes the cached callable
            got, want = fast.run(predict, {"x": ROWS}, keys), plain.run(predict, {"x": ROWS}, keys)
            assert sorted(got) == keys
            for key in keys:
                assert got[key].dtype == want[key].dtype
                np.testing.assert_array_equal(got[key], want[key])
    np.testing.assert_allclose(fast.run(predict, {"x": ROWS}, ["y"])["y"][:, 0],
                               tiny_models.expected_y(ROWS.tolist()))
    _, classify = fast.signature("classify")
    examples = np.array([tiny_models.tiny_example(0.5, 1.5).SerializeToString()], object)
    got = fast.run(classify, {"inputs": examples}, ["classes", "scores"])
    want = plain.run(classify, {"inputs": examples}, ["classes", "scores"])
    assert got["classes"].tolist() == want["classes"].tolist() == [[b"a", b"b"]]
    np.testing.assert_array_equal(got["scores"], want["scores"])
    assert len(fast._callables) == 4  # pylint: disable=protected-access


def test_callables_keep_feed_checks(tiny_pair):
    fast, _ = tiny_pair
    _, predict = fast.signature("serving_default")
    # float64 is converted to the placeholder's float32, as session.run did
    np.testing.assert_array_equal(fast.run(predict, {"x": ROWS.astype(np.float64)}, ["y"])["y"],
                                  fast.run(predict, {"x": ROWS}, ["y"])["y"])
    # Shapes are the graph's to judge, as in C++ Session::Run (TF Serving): a [2, 3] x
    # reaches the MatMul, which refuses it with TF's INVALID_ARGUMENT.
    with pytest.raises(errors.ServingError) as raised:
        fast.run(predict, {"x": np.zeros([2, 3], np.float32)}, ["y"])
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "Matrix size-incompatible" in raised.value.message, raised.value.message
    _, classify = fast.signature("classify")
    with pytest.raises(errors.ServingError) as raised:  # a TF error keeps its canonical code
        fast.run(classify, {"inputs": np.array([b"not an example"], object)}, ["scores"])
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_callables_belong_to_their_version(tmp_path, monkeypatch):
    """A new version (other weights) answers with its own graph, never a cached callable
    of the old one; the cache stays bounded; retiring closes the session under it."""
    base = str(tmp_path / "tiny")
    old = servable_lib.Servable("tiny", 1, tiny_models.write_tiny_model(base, 1))
    new = servable_lib.Servable("tiny", 2, tiny_models.write_tiny_model(
        base, 2, weights=(-1.0, 3.0), bias=0.0))
    _, predict = old.signature("serving_default")
    assert old.run(predict, {"x": ROWS}, ["y"])["y"][:, 0].tolist() == [5.5, -4.5]
    assert new.run(predict, {"x": ROWS}, ["y"])["y"][:, 0].tolist() == [5.0, -15.0]
    monkeypatch.setattr(servable_lib, "MAX_CALLABLES", 2)
    for keys in (["y"], ["doubled"], ["doubled", "y"], ["y"]):
        new.run(predict, {"x": ROWS}, keys)
    assert len(new._callables) == 2  # pylint: disable=protected-access
    old.retire()
    assert old.session._closed  # pylint: disable=protected-access
    assert new.run(predict, {"x": ROWS}, ["y"])["y"][:, 0].tolist() == [5.0, -15.0]
    new.retire()
