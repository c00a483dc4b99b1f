"""--thread_pool_factory_config_file where it maps onto TensorFlow's session thread pools:
a ThreadPoolFactoryConfig holding a tensorflow.ThreadPoolOptionProto becomes the inter-op
pool of every model session (TF Serving's own build registers no factory at all)."""
import numpy as np
import pytest

from slimserve import errors as user_errors
from slimserve.serving import options as options_lib
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.serving.config import session as session_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process

POOL = """thread_pool_factory_config {
  [type.googleapis.com/tensorflow.ThreadPoolOptionProto] { num_threads: 1 global_name: "%s" }
}
"""


def test_pool_becomes_every_session_s_inter_op_pool(tmp_path):
    path = tmp_path / "pools.config"
    path.write_text(POOL % "slimserve-inter-op")
    config = session_lib.session_config(options_lib.ServerOptions(
        thread_pool_factory_config_file=str(path)))
    ((pool,),) = [config.session_inter_op_thread_pool]
    assert (pool.num_threads, pool.global_name) == (1, "slimserve-inter-op")
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    server = serve_in_process([model_config.ServedModel("tiny", base)], rest_api_port=0,
                              enable_model_warmup=False,
                              thread_pool_factory_config_file=str(path))
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="tiny", retries=0)
        rows = np.array([[1.0, 2.0]], np.float32)
        np.testing.assert_allclose(client.predict({"x": rows})["y"][:, 0],
                                   tiny_models.expected_y(rows.tolist()))
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("text, session_text, expected", [
    ('thread_pool_factory_config { [type.googleapis.com/tensorflow.serving.'
     'BatchingParameters] { } }', "", "the one thread pool factory here takes a "
     "tensorflow.ThreadPoolOptionProto"),
    ("", "", "holds 'nothing'"),
    (POOL % "x", "session_inter_op_thread_pool { num_threads: 2 }", "give the pool in one "
     "place"),
    ("thread_pool_factory_config { type_url: 1 }", "", "Error parsing text-format "
     "tensorflow.serving.ThreadPoolFactoryConfig"),
])
def test_what_cannot_map_is_refused_naming_the_file(tmp_path, text, session_text, expected):
    path = tmp_path / "pools.config"
    path.write_text(text)
    session = tmp_path / "session.config"
    session.write_text(session_text)
    with pytest.raises(user_errors.UserError) as raised:
        session_lib.session_config(options_lib.ServerOptions(
            thread_pool_factory_config_file=str(path),
            tensorflow_session_config_file=str(session)))
    assert "--thread_pool_factory_config_file %s" % path in str(raised.value)
    assert expected in str(raised.value)
