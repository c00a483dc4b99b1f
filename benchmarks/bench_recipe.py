"""Training recipes for a user's own small image set, measured: the documented recipe
(configs/own_images_*.flags) against the plain defaults and a small tuning grid, in the
same step budget (300 steps at 32x32, resnet_v1_50), on real data sets that packages
provide offline. docs/your-own-images.md shows the table this prints.

    python benchmarks/bench_recipe.py --work_dir=bench_out/recipe \
        --data digits=DIGITS_DATA --data fashion=FASHION_DATA --checkpoint=SOURCE_RUN
    python benchmarks/bench_recipe.py --report bench_out/recipe/results.jsonl

Each run is `slimserve-train` in its own process (niced) with the flags printed in the
table, so any row can be re-run alone; results are appended to results.jsonl under
--work_dir and a finished run is not trained again (re-running resumes the grid).
Accuracy is the evaluation of the last checkpoint (step 300) on the validation split.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINETUNE_FLAGS = os.path.join("configs", "own_images_finetune.flags")
SCRATCH_FLAGS = os.path.join("configs", "own_images_scratch.flags")
BUDGET = ["--image_size=32", "--max_steps=300"]
# Every grid run names the settings it tries in full, so the defaults being measured
# (opt_epsilon, batch_norm_decay) never leak into the grid's rows.
_FT = ["--checkpoint_exclude_scopes=resnet_v1_50/logits"]
_FREEZE = ["--freeze_scopes=resnet_v1_50/conv1,resnet_v1_50/block1"]
_SPEED = ["--save_checkpoints_steps=100", "--eval_throttle_secs=1", "--noexport",
          "--log_step_count_steps=100", "--save_summary_steps=100"]


def _adam(lr=1e-3, bn=0.9):
    return ["--optimizer=adam", "--learning_rate=%g" % lr, "--opt_epsilon=1e-8",
            "--learning_rate_schedule=cosine", "--decay_steps=300",
            "--end_learning_rate=1e-6", "--batch_norm_decay=%g" % bn]


def _momentum(lr, bn=0.9):
    return ["--optimizer=momentum", "--learning_rate=%g" % lr,
            "--learning_rate_schedule=cosine", "--decay_steps=300",
            "--end_learning_rate=1e-6", "--batch_norm_decay=%g" % bn]


# Light augmentation for small images that fill the frame: most of the image in every
# crop, no flips, nothing cut off at evaluation; and label smoothing.
_LIGHT = ["--min_crop_area=0.85", "--norandom_flip", "--eval_central_fraction=1.0",
          "--label_smoothing=0.1"]
# The demo's fine-tuning settings (configs/digits_finetune.flags), the grid's centre.
_D = _FT + _FREEZE + _adam() + _LIGHT

# (name, uses the checkpoint, flags). "readme example" is the README's training command
# at this budget; "old defaults" pins the values slimserve defaulted to before.
RUNS = [
    ("finetune recipe", True, ["--flagfile=" + FINETUNE_FLAGS]),
    ("readme example with old defaults", True, _FT + _FREEZE + [
        "--batch_norm_decay=0.997", "--opt_epsilon=1.0"]),
    ("readme example with new defaults", True, _FT + _FREEZE),
    ("ft demo settings", True, _D),
    ("ft lr 3e-4", True, _D + ["--learning_rate=3e-4"]),
    ("ft lr 3e-3", True, _D + ["--learning_rate=3e-3"]),
    ("ft bn 0.967", True, _D + ["--batch_norm_decay=0.967"]),
    ("ft bn 0.997", True, _D + ["--batch_norm_decay=0.997"]),
    ("ft flips", True, _D + ["--random_flip"]),
    ("ft no label smoothing", True, _D + ["--label_smoothing=0"]),
    ("ft nothing frozen", True, _FT + _adam() + _LIGHT),
    ("ft slim augmentation", True, _FT + _FREEZE + _adam()),
    ("ft momentum 0.03", True, _FT + _FREEZE + _momentum(0.03) + _LIGHT),
    ("scratch recipe", False, ["--flagfile=" + SCRATCH_FLAGS]),
    ("scratch defaults", False, []),
    ("scratch recipe at lr 1e-3", False, ["--flagfile=" + SCRATCH_FLAGS, "--learning_rate=1e-3"]),
    ("scratch demo settings", False, _adam() + _LIGHT),
    ("scratch lr 3e-3", False, _adam(3e-3) + _LIGHT),
    ("scratch bn 0.967", False, _adam(1e-3, 0.967) + _LIGHT),
    ("scratch momentum 0.1", False, _momentum(0.1) + _LIGHT),
]


def command(name, uses_checkpoint, flags, data_dir, checkpoint, model_dir, seed):
    argv = [os.path.join(os.path.dirname(sys.executable), "slimserve-train")] + flags
    argv += ["--data_dir=" + data_dir, "--model_dir=" + model_dir, "--seed=%d" % seed]
    argv += BUDGET
    if uses_checkpoint:
        argv.append("--checkpoint_path=" + checkpoint)
    if not any(flag.startswith("--flagfile") for flag in flags):
        argv += _SPEED  # the recipe rows run exactly as documented (exports included)
    return argv


def final_accuracy(output):
    for line in output.splitlines():
        if line.startswith("eval: "):
            fields = dict(item.split("=") for item in line[len("eval: "):].split(", "))
            return float(fields["accuracy"]), float(fields["mean_per_class_accuracy"])
    return None, None


def report(paths):
    """Markdown: one row per (data set, run), the recipe rows first, then the commands."""
    records = []
    for path in paths:
        with open(path) as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    order = {run[0]: index for index, run in enumerate(RUNS)}
    records.sort(key=lambda r: (r["data"], order.get(r["name"], 99), r["seed"]))
    lines = ["| data set | run | checkpoint | validation accuracy at step 300 |",
             "|---|---|---|---|"]
    for r in records:
        uses = dict((run[0], run[1]) for run in RUNS).get(r["name"])
        accuracy = "%.1f%%" % (100 * r["accuracy"]) if r["accuracy"] is not None else (
            "failed (exit %d)" % r["exit"])
        lines.append("| %s | %s | %s | %s |" % (r["data"], r["name"],
                                                "source" if uses else "none", accuracy))
    lines += ["", "Commands:", "", "```"]
    lines += ["# %s, %s\n%s" % (r["data"], r["name"], r["command"]) for r in records]
    return "\n".join(lines + ["```"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", help="Runs and results.jsonl go here.")
    parser.add_argument("--data", action="append",
                        help="NAME=TFRECORD_DIR (slimserve-convert output); repeatable.")
    parser.add_argument("--checkpoint",
                        help="Source checkpoint (file or run dir) for the fine-tuning rows.")
    parser.add_argument("--report", nargs="*",
                        help="Print the markdown table of these results.jsonl files instead.")
    parser.add_argument("--only", default="",
                        help="Comma-separated run names to run, in this order (default: all).")
    parser.add_argument("--seeds", default="0", help="Comma-separated --seed values.")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return
    os.makedirs(args.work_dir, exist_ok=True)
    results_path = os.path.join(args.work_dir, "results.jsonl")
    done = set()
    if os.path.exists(results_path):
        with open(results_path) as handle:
            done = {(r["data"], r["name"], r["seed"]) for r in map(json.loads, handle)}
    if not (args.work_dir and args.data and args.checkpoint):
        parser.error("--work_dir, --data and --checkpoint are required to run the grid")
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(wanted) - {run[0] for run in RUNS}
    if unknown:
        sys.exit("bench_recipe: unknown run(s) %s" % sorted(unknown))
    # In --only's order when given (the most telling runs first on a busy machine).
    runs = [run for name in wanted for run in RUNS if run[0] == name] if wanted else RUNS
    for seed in (int(s) for s in args.seeds.split(",")):
        for data in args.data:
            data_name, data_dir = data.split("=", 1)
            for name, uses_checkpoint, flags in runs:
                if (data_name, name, seed) in done:
                    continue
                model_dir = os.path.join(args.work_dir, data_name,
                                         name.replace(" ", "_").replace(",", ""), str(seed))
                subprocess.run(["rm", "-rf", model_dir], check=True)
                argv = command(name, uses_checkpoint, flags, data_dir, args.checkpoint,
                               model_dir, seed)
                started = time.time()
                proc = subprocess.run(["nice", "-n", "10"] + argv, cwd=ROOT,
                                      capture_output=True, text=True)
                with open(model_dir + ".log", "w") as handle:
                    handle.write(proc.stdout + proc.stderr)
                accuracy, per_class = final_accuracy(proc.stdout)
                record = {"data": data_name, "name": name, "seed": seed,
                          "accuracy": accuracy, "mean_per_class_accuracy": per_class,
                          "exit": proc.returncode, "seconds": round(time.time() - started),
                          "command": " ".join(shlex.quote(a) for a in argv)}
                print(json.dumps(record), flush=True)
                with open(results_path, "a") as handle:
                    handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
