# bash bench/device/multi.sh WAIT_S JOB... : several bench runs at once on disjoint cores of a quiet
# machine, each JOB "name:cpus:scenario:size:targets[:extra bench args]" (e.g.
# "lat:0-5:latency:medium:bare-proxy,switchyard" or "con:6-8:contention:full:switchyard:--no-flame";
# the scenario is bench/scenarios/<scenario>.toml; each run's routers take the last core of its set).
# The first call sets up (bench/device/setup.sh: Redis on core 15) and starts every job in the
# background (setsid: they outlive this call); every call waits up to WAIT_S for all of them, then
# tars what there is into $OUT (a run's report.json appears when its run ends).
wait_s=$1; shift
export PYTHONUNBUFFERED=1
if [ ! -e /tmp/dev/started ]; then
  source bench/device/setup.sh
  export PYTHONPATH=/tmp/site
  nproc; python3 --version
  python3 -c "import runtime.gateway.app, runtime.routing.kv_subscriber, bench.runner, bench.targets; print('imports ok')" || exit 3
  rm -rf /tmp/dev; mkdir -p /tmp/dev; : > /tmp/dev/jobs
  for job in "$@"; do
    IFS=: read -r name cpus scenario size targets extra <<< "$job"
    echo "$name" >> /tmp/dev/jobs
    setsid nohup bash bench/device/job.sh "$name" "$cpus" --scenario "bench/scenarios/$scenario.toml" \
      --size "$size" --targets "$targets" $extra > /dev/null 2>&1 < /dev/null &
  done
  touch /tmp/dev/started
fi
export PYTHONPATH=/tmp/site
end=$((SECONDS + wait_s))
while [ $SECONDS -lt $end ]; do
  left=0
  for n in $(cat /tmp/dev/jobs); do [ -e "/tmp/dev/$n/rc" ] || left=1; done
  [ $left = 0 ] && break
  sleep 5
done
for n in $(cat /tmp/dev/jobs); do
  echo "== $n rc=$(cat /tmp/dev/$n/rc 2>/dev/null || echo running)"; tail -30 "/tmp/dev/$n/log" 2>/dev/null
done
tar czf "$OUT/multi.tgz" -C /tmp/dev . 2>/dev/null; ls -la "$OUT"
