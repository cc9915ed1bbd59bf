#!/bin/sh
# repronet-node postinst: register the unit. A new install is enabled but
# not started: `repronet node join URL TOKEN` configures and starts it. An
# upgrade restarts a running node (it drains first).
set -e
if [ "$1" = "configure" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
	if [ -z "$2" ]; then
		systemctl enable repronet-node.service >/dev/null 2>&1 || true
		echo "repronet-node: now run  repronet node join URL-or-MULTIADDR TOKEN  to join a network."
	else
		systemctl try-restart repronet-node.service >/dev/null || true
	fi
fi
exit 0
