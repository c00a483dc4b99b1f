"""The order the suite runs in, and how pytest-xdist workers share it: the costliest work
first, so the long trainings overlap the many short tests instead of ending the run alone.

Work units: tests that share a module- or class-scoped fixture (a served model, a
diverged run) form one unit, given whole to one worker so the fixture is built once;
every other test is a unit by itself. Units are sorted by their cost, the sum of their
tests' COSTS (seconds on a 2-core machine, from `pytest --durations`; 1 s if unlisted).
Session fixtures are not counted: tests/run_once.py builds them once for all workers.

Without xdist the sorted order is simply the run's order. Under `-n N` (xdist's default
`--dist load`) UnitScheduling hands each idle worker the costliest unit left. A worker
only starts a test once it holds the next one, so a worker about to run a long test is
given the cheapest unit left as that next one, not a second long unit that the other
worker could have taken. (xdist's own `--dist loadgroup` would need the group in the
test id, which pytest 9.2 no longer lets a plugin change.) `--dist loadfile` and the
other explicit modes keep xdist's schedulers.
"""
import collections
import json
import os

DEFAULT_COST = 1.0

# Serial seconds (call plus the module fixtures it sets up) of the costliest tests,
# measured with `pytest -p no:xdist --durations=60`. Only the order depends on them:
# a stale or missing entry costs time, never a result.
COSTS = {
    # the fine-tuned run (test_quality.py builds it as a run-wide fixture, from the trained
    # run, which this unit is then charged for and builds first: RUN_WIDE_COSTS)
    "test_quality.py::test_finetuning_reaches_high_accuracy_with_frozen_layers_bit_"
    "identical": 110,
    # (2026-11-27: both fine-tunes with blocks 1-3 frozen, measured alone)
    "test_distributed.py::test_two_replica_training_evaluates_and_exports_on_one_device": 50,
    # measured under -n 2 (2026-11-26; the retrain test since grew from 42 s: a soup of two
    # fine-tunes, 65 s alone); unlisted, they ran last and left a core idle
    "test_retrain.py::test_a_real_fine_tune_from_the_served_export_passes_and_is_promoted": 55,
    "test_label_browser.py::test_two_labellers_at_once": 16,
    "test_label_browser.py::test_click_key_arrows_skip_none_and_resume_after_kill": 8,
    "test_label_browser.py::test_hostile_logged_bytes_never_run_in_the_page": 5,
    "test_faults.py::test_killed_training_resumes_without_rewarming_and_exports": 62,
    "test_training_guards.py::test_exploding_loss_stops_training_with_an_error": 53,
    "test_tuner.py::test_small_grid_end_to_end_writes_flags_config_table_and_plot": 44,
    "test_distributed.py::test_parameter_server_cluster_on_loopback_trains_to_completion": 20,
    "test_acceleration.py::test_xla_compiles_a_training_step_on_cpu_and_computes_the_same": 12,
    "test_tuner.py::test_a_setting_that_breaks_agreement_is_rejected": 34,
    "test_model.py::test_frozen_weights_and_bn_statistics_stay_bit_identical": 32,
    "test_model.py::test_missing_variables_fail_unless_ignored": 29,
    "test_training_guards.py::test_truncated_newest_checkpoint_resumes_from_the_newest_intact_one":
        29,
    "test_first_run.py::test_help_of_every_console_script_lists_its_own_flags": 29,
    "test_export.py::test_export_cli_publishes_atomically_and_rejects_a_failed_verification": 26,
    "test_model.py::test_warm_start_restores_every_variable_including_bn_statistics": 23,
    "test_export_tflite.py::test_export_writes_model_tflite_with_its_parity": 22,
    # (2026-11-29, estimated from a run at load 7 on 2 cores: 1m17s of CPU for the file)
    "test_openvino.py::test_export_writes_the_ir_with_its_parity": 30,
    "test_openvino.py::test_int8_is_refused_saying_by_how_much_or_kept_and_served": 25,
    "test_openvino.py::test_a_version_without_an_ir_is_converted_at_load_and_batched": 12,
    "test_openvino.py::test_a_model_on_openvino_answers_every_signature_as_tensorflow": 10,
    "test_operations.py::test_logged_traffic_of_both_apis_builds_the_next_versions_warmup": 20,
    "test_tuner.py::test_interrupted_tuner_stops_its_servers": 19,
    "test_faults.py::test_killed_export_is_never_loaded_by_a_polling_server": 18,
    "test_batching_tuner.py::test_tuner_measures_writes_the_chosen_config_and_a_plot": 18,
    "test_slow_clients.py::test_trickling_clients_never_lock_out_rest": 18,
    "test_serving.py::test_client_and_loadtest_clis": 16,
    "test_training_guards.py::test_chance_level_model_is_refused_by_both_exporters_and_"
    "slimserve_export": 15,
    "test_request_log_durability.py::test_large_logged_requests_from_six_clients_do_not_kill_"
    "the_server": 14,
    "test_faults.py::test_killed_conversion_never_leaves_a_finished_looking_shard": 13,
    "test_training_guards.py::test_resuming_a_five_class_checkpoint_on_ten_classes_names_the_"
    "head": 13,
    "test_model.py::test_head_shape_mismatch_names_the_variable_and_shapes": 12,
    "test_tfserving_shapes.py::test_random_shapes_at_every_signature_never_take_the_server_"
    "down": 12,
    "test_tfserving_runtime.py::test_harness_runs_a_tagged_suite_against_slimserve_server": 11,
    "test_tfserving_runtime.py::test_models_using_tf_text_ops_load_and_serve": 11,
    "test_client_predict.py::test_json_rows_and_the_signature_flag": 11,
    "test_bulk_predict.py::test_pipes_and_folders_are_error_rows_and_the_bar_counts_"
    "predictions": 11,
    "test_bulk_predict.py::test_a_long_input_list_is_read_ahead_boundedly_under_a_memory_cap":
        10,
    "test_first_run.py::test_data_dir_of_images_or_of_nothing_says_run_slimserve_convert": 10,
    "test_tool_inputs.py::test_loadtest_sends_to_the_input_the_signature_names": 10,
    "test_output_ownership.py::test_a_second_server_refuses_a_served_grpc_port_and_takes_a_"
    "socket_over": 10,
    "test_serving.py::test_new_version_under_load_is_picked_up_with_zero_failures": 9,
    "test_precision.py::test_xla_compiles_the_served_graph": 9,
    "test_first_run.py::test_checkpoint_of_another_net_names_its_model_name_before_writing": 8,
    "test_rest.py::test_sigterm_answers_rest_and_grpc_requests_in_flight": 8,
    "test_beam.py::test_beam_conversion_equals_local_converter": 8,
    "test_serving.py::test_model_config_file_and_sigterm": 8,
}


LONG = 10.0  # seconds: a test this costly gets the cheapest unit queued behind it
UNITS_FILE = "units.json"


def _shared_fixture_module(item):
    """The item's module if it uses a fixture that lives longer than one test there."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info else ()):
        if definitions and definitions[-1].scope in ("class", "module", "package"):
            return item.nodeid.split("::")[0].rsplit("/", 1)[-1][:-len(".py")]
    return None


def cost(nodeid):
    return COSTS.get(nodeid.split("/", 1)[-1], DEFAULT_COST)


# The quick loop (`pytest -m "not slow"`) leaves out what trains: a test listed above at
# SLOW_SECONDS or more, and every test of the session's trained run (building it alone is
# about a minute); `make test` runs everything.
SLOW_SECONDS = 5
SLOW_FIXTURES = {"trained_run", "export_dir"}


def is_slow(item):
    return (cost(item.nodeid) >= SLOW_SECONDS
            or bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))))


# Run-wide fixtures (tests/run_once.py) that take long to build, in seconds. The unit that
# builds one is the costliest unit using it, so it is charged the build: queued early, it
# builds the fixture before the other worker reaches a test that would wait for it (a run
# of 2026-11-26 lost ~45 s of a core to a worker waiting for the trained run).
RUN_WIDE_COSTS = {"trained_run": 55}


def _unit_costs(units):
    """{unit key: seconds}: its tests' COSTS, plus each run-wide build it is the first
    (costliest) user of."""
    costs = {key: sum(cost(i.nodeid) for i in unit) for key, unit in units.items()}
    for fixture, seconds in RUN_WIDE_COSTS.items():
        users = [key for key, unit in units.items()
                 if any(fixture in getattr(i, "fixturenames", ()) for i in unit)]
        if users:
            costs[max(users, key=costs.get)] += seconds
    return costs


def arrange(items, units_path=None):
    """Reorders `items` in place into units, costliest first; writes {test id: unit} to
    `units_path` (a worker's collection, read by the controller's UnitScheduling)."""
    units = collections.OrderedDict()
    for item in items:
        units.setdefault(_shared_fixture_module(item) or item.nodeid, []).append(item)
    costs = _unit_costs(units)
    ordered = [units[key] for key in sorted(units, key=lambda key: -costs[key])]
    items[:] = [item for unit in ordered for item in unit]
    if units_path:
        temporary = "%s.%d" % (units_path, os.getpid())
        with open(temporary, "w") as handle:
            json.dump({item.nodeid: unit_key for unit_key, unit in units.items()
                       for item in unit}, handle)
        os.replace(temporary, units_path)  # every worker writes the same map


def units_path(config):
    """Where workers leave the unit map for the controller: the run's shared folder."""
    # pylint: disable=protected-access
    base = config._tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return str(base / UNITS_FILE)


def _xdist_scheduler_class():
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class UnitScheduling(LoadScopeScheduling):
        """LoadScopeScheduling over arrange()'s units in arrange()'s order."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # the collection order is the plan
            self._units = None

        def _split_scope(self, nodeid):
            if self._units is None:
                try:
                    with open(units_path(self.config)) as handle:
                        self._units = json.load(handle)
                except OSError:
                    self._units = {}  # no map: every test is its own unit
            return self._units.get(nodeid, nodeid)

        def _assign_work_unit(self, node, cheapest=False):
            scope, work_unit = self.workqueue.popitem(last=cheapest)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid)
                                    for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            pending = [nodeid for unit in self.assigned_work[node].values()
                       for nodeid, done in unit.items() if not done]
            if len(pending) >= 2:
                return
            self._assign_work_unit(node, cheapest=bool(pending) and cost(pending[0]) >= LONG)

    return UnitScheduling


class XdistPlugin:
    """Registered by conftest when pytest-xdist is installed."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "load":
            return None  # an explicit --dist mode other than load: xdist's own
        return _xdist_scheduler_class()(config, log)
