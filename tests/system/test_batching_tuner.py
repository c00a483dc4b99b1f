"""slimserve-tune-batching on a small grid: real server processes, real images, a
TF Serving batching file and a plot come out, and the choice follows the budget."""
import os
import subprocess
import sys

import pytest

from slimserve.serving.core import batching
from slimserve.serving.tuning import tuner as tuner_lib
from tests.helpers import ROOT


@pytest.mark.cost(18)
def test_tuner_measures_writes_the_chosen_config_and_a_plot(export_dir, digits_dir, tmp_path):
    config, png = tmp_path / "batching.config", tmp_path / "batching.png"
    out = subprocess.run(
        [sys.executable, "-m", "slimserve.cli.tune_batching", "--model_base_path",
         os.path.dirname(export_dir), "--images", os.path.join(digits_dir, "3"),
         "--latency_budget_ms", "100000", "--concurrency", "4", "--requests", "40",
         "--max_batch_sizes", "1,8", "--batch_timeouts_micros", "5000",
         "--num_batch_threads", "1", "--output_config", str(config), "--output_png", str(png),
         "--noprogress", "--max_minutes", "5"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith("| ") and "max_batch" not in l]
    assert len(lines) == 3  # two grid settings and TF Serving's documented CPU start
    rows = {int(l.split("|")[1]): l.split("|") for l in lines}
    assert float(rows[1][8]) == 1.0  # max_batch_size 1 can only run batches of one
    assert float(rows[8][8]) > 1.0  # four clients and a 5 ms window do fill batches
    chosen = batching.BatchingParameters.from_file(str(config))  # TF Serving's format
    assert "chosen: b%d t%dus" % (chosen.max_batch_size, chosen.batch_timeout_micros) in out.stdout
    assert "documented CPU starting point" in config.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_choice_respects_the_latency_budget_and_errors():
    rows = [dict(max_batch_size=b, batch_timeout_micros=0, num_batch_threads=1,
                 max_enqueued_batches=1, images_per_s=rate, p99_ms=p99, errors=err,
                 p50_ms=1.0, mean_batch=1.0, requests=10)
            for b, rate, p99, err in ((1, 10.0, 5.0, 0), (2, 30.0, 50.0, 0), (4, 40.0, 9.0, 3))]
    assert tuner_lib.choose(rows, 20.0)["max_batch_size"] == 1
    assert tuner_lib.choose(rows, 60.0)["max_batch_size"] == 2
    assert tuner_lib.choose(rows, 1.0) is None


def test_load_reports_its_steady_part_apart_from_the_drain(tmp_path):
    """A closed-loop load that ends leaves batches that no longer fill: with batches of
    exactly the concurrency and a 2 s timeout, the last two requests wait the timeout out.
    The steady figures (what the tuners compare) leave that drain out; the totals keep it."""
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import loadtest  # pylint: disable=import-outside-toplevel
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
    from slimserve.testing.servers import serve_in_process  # pylint: disable=import-outside-toplevel
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    server = serve_in_process(
        [model_config.ServedModel("tiny", base)], enable_model_warmup=False, rest_api_port=0,
        batching_parameters=batching.BatchingParameters(max_batch_size=4,
                                                        batch_timeout_micros=2000000))
    client = client_lib.Client("127.0.0.1:%d" % server.port, "tiny", retries=0)
    try:
        # 4 clients, 10 requests: two full batches of 4, then a batch of 2 that never fills
        result = loadtest.run_level(client, [[1.0, 2.0]], 4, 10, input_key="x")
    finally:
        client.close()
        server.stop()
    assert result["requests"] == 10 and not result["errors"]
    assert result["p99_ms"] >= 2000.0  # the drain's batch waited out its timeout
    assert 4 <= result["steady_requests"] <= 8  # the drain's two are left out
    assert result["steady_p99_ms"] < 2000.0
    assert result["steady_seconds"] < result["seconds"]
    assert result["steady_images_per_s"] > result["images_per_s"]
