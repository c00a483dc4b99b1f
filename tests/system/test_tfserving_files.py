"""The real TF Serving files parse as the protos TF Serving reads, and the docker
script refuses a path that holds no version."""
import os
import subprocess

from slimserve import errors as user_errors
from slimserve.serving.core import batching
from slimserve.serving.config import model_config
from slimserve.serving import server
from tests.helpers import ROOT

CONFIG = os.path.join(ROOT, "serving", "tfserving")


def test_models_config_is_a_valid_model_server_config():
    (config,) = model_config.parse_model_config_file(os.path.join(CONFIG, "models.config"))
    assert (config.name, config.base_path) == ("resnet", "/models/resnet")
    assert config.policy.select([1, 2, 3]) == {2, 3}


def test_batching_and_monitoring_configs_parse():
    params = batching.BatchingParameters.from_file(os.path.join(CONFIG, "batching.config"))
    assert (params.max_batch_size, params.batch_timeout_micros, params.num_batch_threads) == (
        8, 2000, 2)
    assert server.read_monitoring_path(os.path.join(CONFIG, "monitoring.config")) == \
        "/monitoring/prometheus/metrics"


def test_bad_batching_file_names_the_flag(tmp_path):
    bad = tmp_path / "b.config"
    bad.write_text("max_batch_size: 8\n")
    try:
        batching.BatchingParameters.from_file(str(bad))
    except user_errors.UserError as error:
        assert "--batching_parameters_file" in str(error) and "b.config" in str(error)
    else:
        raise AssertionError("accepted a malformed batching file")


def test_docker_script_refuses_a_base_path_without_versions(tmp_path):
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "serve_docker.sh"),
                          str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "no integer version folder" in out.stderr
