# bash bench/device/encoder.sh [SIZE]: on a GPU machine, the PyTorch encoder worker on CUDA behind
# the router, dynamic batching on vs off (throughput at equal p95, bench/scenarios/
# embeddings-gpu.toml; SIZE full by default, ~4-6 minutes, bounded at 8), results tarred into
# $OUT. Needs .devkit from bench/device/make-encoder-kit.sh and the machine's own CUDA torch.
size=${1:-full}
export PYTHONUNBUFFERED=1
export REDIS_CPU=0  # the worker is pinned to the last core (bench/embeddings.py)
source bench/device/setup.sh
export PYTHONPATH=/tmp/site
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 - <<'PY' || { echo "encoder.sh: this machine has no CUDA torch; nothing to measure"; exit 3; }
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY
rm -rf /tmp/dev; mkdir -p /tmp/dev
python3 -m bench.encoder_model --like .devkit/minilm-shape --out /tmp/dev/minilm || exit 4
timeout 480 python3 -m bench.embeddings --scenario bench/scenarios/embeddings-gpu.toml \
  --size "$size" --device cuda --via-router redis://127.0.0.1:6379/0 \
  --model-dir /tmp/dev/minilm --out /tmp/dev/enc 2>&1 | tee /tmp/dev/enc.log | tail -40
echo "rc=${PIPESTATUS[0]}"
tar czf "$OUT/encoder-gpu.tgz" -C /tmp/dev enc enc.log 2>/dev/null; ls -la "$OUT"
