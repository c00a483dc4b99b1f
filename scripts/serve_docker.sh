#!/usr/bin/env bash
# Serves a slimserve export base path with the real tensorflow/serving image:
# model "resnet", gRPC on 8500, REST on 8501, batching, warmup and Prometheus metrics.
#
#   scripts/serve_docker.sh EXPORT_BASE            # e.g. demo_out/run/export/final
#   MODEL_CONFIG=1 scripts/serve_docker.sh EXPORT_BASE   # use serving/tfserving/models.config
#
# Environment: IMAGE (default tensorflow/serving:2.15.0), GRPC_PORT, REST_PORT.
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 EXPORT_BASE   (a folder of integer version sub-folders)" >&2
  exit 2
fi
if ! ls "$1" | grep -qE '^[0-9]+$'; then
  echo "$0: $1 holds no integer version folder; export a model first" >&2
  exit 2
fi
export_base=$(cd "$1" && pwd)
config_dir=$(cd "$(dirname "$0")/../serving/tfserving" && pwd)
image=${IMAGE:-tensorflow/serving:2.15.0}
model_args=(--model_name=resnet --model_base_path=/models/resnet)
if [ "${MODEL_CONFIG:-0}" = 1 ]; then
  model_args=(--model_config_file=/config/models.config)
fi
exec docker run --rm --init \
  -p "${GRPC_PORT:-8500}:8500" -p "${REST_PORT:-8501}:8501" \
  -v "$export_base:/models/resnet:ro" \
  -v "$config_dir:/config:ro" \
  "$image" \
  --port=8500 --rest_api_port=8501 \
  "${model_args[@]}" \
  --enable_batching --batching_parameters_file=/config/batching.config \
  --monitoring_config_file=/config/monitoring.config \
  --enable_model_warmup=true \
  --file_system_poll_wait_seconds=1
