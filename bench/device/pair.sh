# bash bench/device/pair.sh SIZE LAT_TARGETS CON_TARGETS [extra bench args]: the latency and contention scenarios
# at once on disjoint cores (latency 0-7, its routers on 7 and 6; contention 8-14, its router on 14;
# Redis on 15), results tarred into $OUT.
size=$1; lat=$2; con=$3; shift 3
export PYTHONUNBUFFERED=1
source bench/device/setup.sh
export PYTHONPATH=/tmp/site
nproc; command -v taskset; python3 --version
python3 -c "import runtime.gateway.app, bench.runner, bench.targets; print('imports ok')" || exit 3
rm -rf /tmp/dev; mkdir -p /tmp/dev
bash bench/device/job.sh lat 0-7 --scenario bench/scenarios/latency.toml --size "$size" --targets "$lat" "$@" &
bash bench/device/job.sh con 8-14 --scenario bench/scenarios/contention.toml --size "$size" --targets "$con" "$@" &
wait
for n in lat con; do echo "== $n rc=$(cat /tmp/dev/$n/rc)"; tail -25 /tmp/dev/$n/log; done
tar czf $OUT/$size.tgz -C /tmp/dev . 2>/dev/null; ls -la $OUT
