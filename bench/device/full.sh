# bash bench/device/full.sh WAIT_S LAT_SIZE CON_SIZE LAT_TARGETS CON_TARGETS: first call sets up and starts both
# scenarios in the background (setsid: they outlive this call); every call waits up to WAIT_S for
# both to finish, then tars the results into $OUT.
wait_s=$1; lsize=$2; csize=$3; lat=$4; con=$5
export PYTHONUNBUFFERED=1
if [ ! -e /tmp/dev/started ]; then
  source bench/device/setup.sh
  export PYTHONPATH=/tmp/site
  python3 -c "import runtime.gateway.app, bench.runner, bench.targets; print('imports ok')" || exit 3
  rm -rf /tmp/dev; mkdir -p /tmp/dev; touch /tmp/dev/started
  setsid nohup bash bench/device/job.sh lat 0-7 --scenario bench/scenarios/latency.toml --size "$lsize" --targets "$lat" > /dev/null 2>&1 < /dev/null &
  setsid nohup bash bench/device/job.sh con 8-14 --scenario bench/scenarios/contention.toml --size "$csize" --targets "$con" > /dev/null 2>&1 < /dev/null &
fi
end=$((SECONDS + wait_s))
while [ $SECONDS -lt $end ]; do
  [ -e /tmp/dev/lat/rc ] && [ -e /tmp/dev/con/rc ] && break
  sleep 5
done
for n in lat con; do echo "== $n rc=$(cat /tmp/dev/$n/rc 2>/dev/null || echo running)"; tail -4 /tmp/dev/$n/log 2>/dev/null; done
if [ -e /tmp/dev/lat/rc ] && [ -e /tmp/dev/con/rc ]; then
  for n in lat con; do tail -30 /tmp/dev/$n/log; done
  tar czf $OUT/full.tgz -C /tmp/dev . 2>/dev/null; ls -la $OUT
fi
