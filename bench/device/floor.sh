# bash bench/device/floor.sh "RATES" ROUNDS SECONDS: on a lent machine's quiet cores (8-14; Redis on 15),
# issue #27's CPU split in one run per rate: bench.tls_micro over bare-proxy, transport-proxy,
# switchyard-chassis and switchyard (routers on core 14), each rate's JSON and log into $OUT.
rates=${1:-100}; rounds=${2:-3}; seconds=${3:-8}
export PYTHONUNBUFFERED=1
source bench/device/setup.sh > /dev/null
export PYTHONPATH=/tmp/site REDIS_URL=redis://127.0.0.1:6379/0
nproc; python3 --version
python3 -c "import runtime.gateway.app, bench.transport_proxy, bench.chassis_router, bench.tls_micro; print('imports ok')" || exit 3
for rate in $rates; do
  taskset -c 8-14 python3 -m bench.tls_micro --targets bare-proxy,transport-proxy,switchyard-chassis,switchyard \
    --rate "$rate" --rounds "$rounds" --seconds "$seconds" > "$OUT/floor-$rate.json" 2> "$OUT/floor-$rate.log"
  echo "== rate $rate rc=$?"; grep -v '^switchyard:' "$OUT/floor-$rate.log" | tail -"$((4 * rounds))"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('median_cpu_ms_per_request', 'ratio_vs_plain', 'same_bytes_as_direct', 'router_cpus', 'load_average')})" "$OUT/floor-$rate.json"
done
