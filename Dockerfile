# slimserve's images: one Dockerfile, three targets. Replace REGISTRY with the registry your
# cluster pulls from (serving/kubernetes/*.yaml name the same images):
#   docker build --target train   -t REGISTRY/slimserve:0.1.0 .         every command, Beam, configs/
#   docker build --target serving -t REGISTRY/slimserve-server:0.1.0 .  slimserve-server and the clients, no Beam
#   docker build --target gpu     -t REGISTRY/slimserve-gpu:0.1.0 .     training on NVIDIA GPUs
# `train` is also the default target. Examples:
#   docker run --rm -v $PWD/work:/work REGISTRY/slimserve:0.1.0 slimserve-train \
#     --flagfile=/opt/slimserve/configs/digits_finetune.flags --data_dir=/work/data ...
#   docker run --rm -p 8500:8500 -p 8501:8501 -v $PWD/export/final:/models/resnet:ro \
#     REGISTRY/slimserve-server:0.1.0    # the embedded server on /models/resnet
# The gpu target installs TensorFlow's CUDA wheels (tensorflow[and-cuda] 2.15: CUDA 12.2,
# cuDNN 8.9 from pip, found by TensorFlow 2.15 without LD_LIBRARY_PATH); the host needs only
# the NVIDIA driver and container toolkit. It has not been built or run by this project: its
# machines have no Docker engine and no GPU.
# Python 3.11: TensorFlow 2.15 (the last release with tf.estimator) has no wheel for 3.12.
FROM python:3.11-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 1000 slimserve
# setup.py with empty packages first, so each dependency layer is rebuilt only when the
# pins change, not on every source edit.
WORKDIR /opt/slimserve
COPY setup.py ./
RUN mkdir -p slimserve estimator export serving flywheel \
    && touch slimserve/__init__.py estimator/__init__.py export/__init__.py serving/__init__.py \
        flywheel/__init__.py

FROM base AS serving-deps
RUN pip install . && pip uninstall -y slimserve

FROM base AS train-deps
RUN pip install ".[beam]" && pip uninstall -y slimserve

FROM base AS gpu-deps
RUN pip install "tensorflow[and-cuda]>=2.15,<2.16" . && pip uninstall -y slimserve

# The source tree, once for every target: the five packages and the flagfile recipes.
FROM base AS source
COPY slimserve/ slimserve/
COPY estimator/ estimator/
COPY export/ export/
COPY serving/ serving/
COPY flywheel/ flywheel/
COPY configs/ configs/

FROM serving-deps AS serving
COPY --from=source /opt/slimserve/ /opt/slimserve/
RUN pip install --no-deps /opt/slimserve
USER 1000:1000
WORKDIR /work
EXPOSE 8500 8501
CMD ["slimserve-server", "--port=8500", "--rest_api_port=8501", "--bind_address=0.0.0.0", \
     "--model_name=resnet", "--model_base_path=/models/resnet"]

FROM gpu-deps AS gpu
COPY --from=source /opt/slimserve/ /opt/slimserve/
RUN pip install --no-deps /opt/slimserve
USER 1000:1000
WORKDIR /work
EXPOSE 2222
CMD ["slimserve-train", "--help"]

FROM train-deps AS train
COPY --from=source /opt/slimserve/ /opt/slimserve/
RUN pip install --no-deps /opt/slimserve
USER 1000:1000
WORKDIR /work
EXPOSE 8500 8501 2222
CMD ["slimserve-server", "--port=8500", "--rest_api_port=8501", "--bind_address=0.0.0.0", \
     "--model_name=resnet", "--model_base_path=/models/resnet"]
