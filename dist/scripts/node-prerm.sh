#!/bin/sh
# repronet-node prerm: on removal, stop the node (it drains: running
# attempts finish or are handed back) and disable it.
set -e
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
	systemctl stop repronet-node.service >/dev/null 2>&1 || true
	systemctl disable repronet-node.service >/dev/null 2>&1 || true
fi
exit 0
