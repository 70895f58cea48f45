# bash bench/device/con.sh SIZE TARGETS: the contention scenario alone (cores 8-14, Redis on 15), tarred into $OUT
export PYTHONUNBUFFERED=1
source bench/device/setup.sh
export PYTHONPATH=/tmp/site
rm -rf /tmp/dev; mkdir -p /tmp/dev
bash bench/device/job.sh con 8-14 --scenario bench/scenarios/contention.toml --size "$1" --targets "$2"
echo "rc=$(cat /tmp/dev/con/rc)"; tail -12 /tmp/dev/con/log
tar czf $OUT/con.tgz -C /tmp/dev . 2>/dev/null; ls -la $OUT
