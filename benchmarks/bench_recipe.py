"""The own-images recipe against a small grid, on data sets it was not tuned on: the
command README shows (`slimserve-train --recipe=auto`, without a pretrained checkpoint)
against learning rates and run lengths from scratch, and the routes with a checkpoint
(the recipe's frozen stem and block1, or nothing frozen). docs/your-own-images.md shows
the tables this prints.

    python benchmarks/bench_recipe.py --work_dir=bench_out/recipe --checkpoint=SOURCE_RUN \
        --data mnist=MNIST_DATA --data elpv=ELPV_DATA --data lfw=LFW_DATA
    python benchmarks/bench_recipe.py --report bench_out/recipe/results.jsonl

Each run is `slimserve-train` in its own process (niced) with the flags the table prints
(its checkpoints and exports removed afterwards unless --keep_runs),
so any row can be re-run alone; results are appended to results.jsonl under --work_dir
and a finished run is not trained again (re-running resumes the grid). Accuracy is the
last evaluation (the final checkpoint) on the validation split: on a set converted with
--group_regex, groups the training never saw. Besides the wall time (which other work on
the machine stretches: the load average before and after is recorded) each row records the
run's CPU time, which divided by the cores used says what the run costs an idle machine.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = ["--image_size=32"]
_QUIET = ["--noexport"]  # grid rows: the evaluations are the measurement

# (name, uses the checkpoint, flags). The first row is README's own-images command; the
# scratch rows are the grid around it (learning rate x run length), the checkpoint rows
# the routes with a source checkpoint (its recipe, frozen or not, and run length).
RUNS = [
    ("readme command", False, ["--recipe=auto"]),
    ("auto with a checkpoint", True, ["--recipe=auto"]),
    ("scratch 300 steps", False, ["--recipe=scratch", "--max_steps=300"]),
    ("scratch lr 1e-3", False, ["--recipe=scratch", "--max_steps=300",
                                "--learning_rate=1e-3"] + _QUIET),
    ("scratch lr 1e-2", False, ["--recipe=scratch", "--max_steps=300",
                                "--learning_rate=1e-2"] + _QUIET),
    ("scratch 1000 steps lr 1e-3", False,
     ["--recipe=scratch", "--max_steps=1000", "--learning_rate=1e-3"] + _QUIET),
    ("scratch 1000 steps lr 1e-2", False,
     ["--recipe=scratch", "--max_steps=1000", "--learning_rate=1e-2"] + _QUIET),
    ("checkpoint frozen 300 steps", True,
     ["--recipe=finetune", "--max_steps=300",
      "--freeze_scopes=resnet_v1_50/conv1,resnet_v1_50/block1"]),
    ("checkpoint nothing frozen 300 steps", True,
     ["--recipe=finetune", "--max_steps=300", "--freeze_scopes="] + _QUIET),
    ("checkpoint frozen 1000 steps", True,
     ["--recipe=finetune", "--max_steps=1000",
      "--freeze_scopes=resnet_v1_50/conv1,resnet_v1_50/block1"] + _QUIET),
]
_LOCK = threading.Lock()


def command(flags, data_dir, checkpoint, model_dir, seed, uses_checkpoint):
    argv = [os.path.join(os.path.dirname(sys.executable), "slimserve-train")] + flags
    argv += ["--data_dir=" + data_dir, "--model_dir=" + model_dir, "--seed=%d" % seed]
    argv += BUDGET
    if uses_checkpoint:
        argv.append("--checkpoint_path=" + checkpoint)
    return argv


def final_accuracy(output):
    """(accuracy, mean per-class accuracy) of the run's last evaluation."""
    for line in output.splitlines():
        if line.startswith("eval: "):
            values = dict(item.split("=") for item in line[len("eval: "):].split(", "))
            return float(values["accuracy"]), float(values["mean_per_class_accuracy"])
    return None, None


def _settings(flags, uses_checkpoint):
    """(steps, learning rate, what the checkpoint column says) a row trained with: its
    flags, else its recipe's."""
    from slimserve.estimator import recipes  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import train_config  # pylint: disable=import-outside-toplevel
    given = dict(f[2:].split("=", 1) for f in flags if "=" in f)
    route = recipes.route(given.get("recipe", "scratch"), "x" if uses_checkpoint else None)
    recipe = recipes.settings(train_config.TrainConfig, route)
    steps = given.get("max_steps", recipe.get(("run", "max_steps")))
    rate = given.get("learning_rate", "%g" % recipe.get(("model", "learning_rate")))
    frozen = given.get("freeze_scopes", ",".join(recipe.get(("model", "freeze_scopes"), ())))
    source = "none" if not uses_checkpoint else (
        "source, frozen %s" % frozen.replace("resnet_v1_50/", "") if frozen else
        "source, nothing frozen")
    return steps, rate, source


def report(paths):
    """Markdown: per data set, one row per run, then the recipe against the best of the
    from-scratch grid, then every command."""
    records = []
    for path in paths:
        with open(path) as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    order = {run[0]: index for index, run in enumerate(RUNS)}
    uses = {run[0]: run[1] for run in RUNS}
    runs = {run[0]: run[2] for run in RUNS}
    records.sort(key=lambda r: (r["data"], order.get(r["name"], 99), r["seed"]))
    lines = ["| data set | run | checkpoint | steps | learning rate | validation accuracy "
             "| CPU minutes | wall minutes (load) |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        steps, rate, source = _settings(runs.get(r["name"], []), uses.get(r["name"]))
        accuracy = "%.1f%%" % (100 * r["accuracy"]) if r["accuracy"] is not None else (
            "failed (exit %d)" % r["exit"])
        lines.append("| %s | %s | %s | %s | %s | %s | %.1f | %.1f (%.1f-%.1f) |" % (
            r["data"], r["name"], source, steps, rate, accuracy,
            r["cpu_seconds"] / 60.0, r["seconds"] / 60.0, r["load"][0], r["load"][1]))
    lines.append("")
    for data in sorted({r["data"] for r in records}):
        scratch = [r for r in records if r["data"] == data and not uses.get(r["name"])
                   and r["accuracy"] is not None]
        readme = [r for r in scratch if r["name"] == "readme command"]
        if readme and scratch:
            best = max(scratch, key=lambda r: r["accuracy"])
            lines.append("- %s: README's command %.1f%%, best of the from-scratch grid %.1f%% "
                         "(%s): %+.1f points" % (
                             data, 100 * readme[0]["accuracy"], 100 * best["accuracy"],
                             best["name"], 100 * (readme[0]["accuracy"] - best["accuracy"])))
    lines += ["", "Commands:", "", "```"]
    lines += ["# %s, %s\n%s" % (r["data"], r["name"], r["command"]) for r in records]
    return "\n".join(lines + ["```"])


def run_one(job, work_dir, checkpoint, results_path, keep=False):
    data_name, data_dir, (name, uses_checkpoint, flags), seed = job
    model_dir = os.path.join(work_dir, data_name, name.replace(" ", "_").replace(",", ""),
                             str(seed))
    subprocess.run(["rm", "-rf", model_dir], check=True)
    argv = command(flags, data_dir, checkpoint, model_dir, seed, uses_checkpoint)
    load_before = os.getloadavg()[0]
    started = time.time()
    # The child's CPU time: wait4's rusage of this one process (threads included).
    process = subprocess.Popen(["nice", "-n", "10"] + argv, cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = []
    for line in process.stdout:
        output.append(line)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    with open(model_dir + ".log", "w") as handle:
        handle.write("".join(output))
    if not keep:  # a resnet_v1_50 run leaves ~1.5 GB of checkpoints and exports
        for entry in os.listdir(model_dir) if os.path.isdir(model_dir) else []:
            if entry.startswith("model.ckpt-") or entry == "export":
                subprocess.run(["rm", "-rf", os.path.join(model_dir, entry)], check=True)
    text = "".join(output)
    accuracy, per_class = final_accuracy(text)
    record = {"data": data_name, "name": name, "seed": seed, "accuracy": accuracy,
              "mean_per_class_accuracy": per_class, "exit": process.returncode,
              "evaluations": text.count(" eval at step "),
              "seconds": round(time.time() - started),
              "cpu_seconds": round(usage.ru_utime + usage.ru_stime),
              "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
              "command": " ".join(shlex.quote(a) for a in argv)}
    with _LOCK:
        print(json.dumps(record), flush=True)
        with open(results_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", help="Runs and results.jsonl go here.")
    parser.add_argument("--data", action="append",
                        help="NAME=TFRECORD_DIR (slimserve-convert output); repeatable.")
    parser.add_argument("--checkpoint",
                        help="Source checkpoint (file or run dir) for the rows that use one.")
    parser.add_argument("--report", nargs="*",
                        help="Print the markdown table of these results.jsonl files instead.")
    parser.add_argument("--only", default="",
                        help="Comma-separated run names to run, in this order (default: all).")
    parser.add_argument("--seeds", default="0", help="Comma-separated --seed values.")
    parser.add_argument("--keep_runs", action="store_true",
                        help="Keep each run's checkpoints and exports (by default only its "
                             "log, flags.txt and evaluation events stay: ~1.5 GB a run).")
    parser.add_argument("--workers", type=int, default=1,
                        help="Runs at once (each is a niced slimserve-train process).")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return
    if not (args.work_dir and args.data):
        parser.error("--work_dir and --data are required to run the grid")
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(wanted) - {run[0] for run in RUNS}
    if unknown:
        sys.exit("bench_recipe: unknown run(s) %s" % sorted(unknown))
    runs = [run for name in wanted for run in RUNS if run[0] == name] if wanted else RUNS
    if any(run[1] for run in runs) and not args.checkpoint:
        parser.error("--checkpoint is needed for the rows that use one")
    os.makedirs(args.work_dir, exist_ok=True)
    results_path = os.path.join(args.work_dir, "results.jsonl")
    done = set()
    if os.path.exists(results_path):
        with open(results_path) as handle:
            done = {(r["data"], r["name"], r["seed"]) for r in map(json.loads, handle)}
    jobs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for run in runs:  # a run on every data set before the next run: the telling rows first
            for data in args.data:
                data_name, data_dir = data.split("=", 1)
                if (data_name, run[0], seed) not in done:
                    jobs.append((data_name, os.path.abspath(data_dir), run, seed))
    checkpoint = os.path.abspath(args.checkpoint) if args.checkpoint else None
    with concurrent.futures.ThreadPoolExecutor(max(1, args.workers)) as pool:
        list(pool.map(lambda job: run_one(job, args.work_dir, checkpoint, results_path,
                                          args.keep_runs), jobs))


if __name__ == "__main__":
    from slimserve import cpu  # pylint: disable=g-import-not-at-top
    print(cpu.describe(), flush=True)  # a figure of speed means little without its CPU
    main()
