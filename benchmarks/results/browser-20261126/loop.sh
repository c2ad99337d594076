#!/usr/bin/env bash
cd /work/wt-browser
: > /tmp/browser_loop.log
for i in $(seq 1 20); do
  start=$(date +%s)
  /work/venv/bin/python -m pytest tests/browser -q -n 0 -p no:cacheprovider > /tmp/browser_run_$i.log 2>&1
  rc=$?
  echo "run $i rc=$rc $(( $(date +%s) - start )) s $(tail -1 /tmp/browser_run_$i.log)" >> /tmp/browser_loop.log
  [ $rc -ne 0 ] && break
done
echo done >> /tmp/browser_loop.log
