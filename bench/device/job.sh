# bash bench/device/job.sh NAME CPUS ARGS... : one bench run under taskset, results in /tmp/dev/NAME, done-file at the end
name=$1; cpus=$2; shift 2
mkdir -p /tmp/dev/$name
( taskset -c "$cpus" python3 -m bench run --out /tmp/dev/$name/results "$@" > /tmp/dev/$name/log 2>&1; echo $? > /tmp/dev/$name/rc ) 
