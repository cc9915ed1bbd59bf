#!/bin/sh
# repronet-coordinator prerm: on removal, stop and disable the service.
set -e
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
	systemctl stop repronet-coordinator.service >/dev/null 2>&1 || true
	systemctl disable repronet-coordinator.service >/dev/null 2>&1 || true
fi
exit 0
