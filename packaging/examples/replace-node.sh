#!/bin/sh
# An example command for the reference replacement hook (xpuctl hook serve --exec). The hook runs it once per fault
# whose action reaches [hook] min_action (default replace_node), with the fault as JSON on stdin and XPU_FAULT_ID,
# XPU_NODE_NAME, XPU_FAULT_ACTION, XPU_FAULT_CODE and XPU_FAULT_SEQ in the environment. Exit 0 only once the work
# is done: any other status makes the daemon deliver the fault again later (with back-off).
#
# What it does: keeps the fault under $XPU_HOOK_SPOOL (one file per fault id, so a delivery that comes again is
# recognised), and with XPU_HOOK_CORDON=1 and kubectl on PATH cordons the node so no new pod lands on it. Put the
# call to your own standby-replacement system (a ticket, a cloud API, a scheduler drain) where the comment says.
set -eu

spool=${XPU_HOOK_SPOOL:-${TMPDIR:-/tmp}/xpu-hook}
id=${XPU_FAULT_ID:?XPU_FAULT_ID is not set: run me from xpuctl hook serve}
node=${XPU_NODE_NAME:-$(hostname)}
mkdir -p "$spool"
record=$spool/$id.json

if [ -e "$record" ]; then
  echo "fault $id on $node already handled ($record)"
  exit 0
fi

cat > "$record.tmp"
if [ "${XPU_HOOK_CORDON:-0}" = 1 ] && command -v kubectl >/dev/null 2>&1; then
  kubectl cordon "$node"
fi
# Call your replacement system here, e.g.: request-standby --node "$node" --reason "$XPU_FAULT_CODE" < "$record.tmp"
mv "$record.tmp" "$record"  # only now is the fault handled: a failure above leaves it to be delivered again
echo "fault $id ($XPU_FAULT_CODE, $XPU_FAULT_ACTION) on $node recorded in $record"
