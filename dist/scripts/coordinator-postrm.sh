#!/bin/sh
# repronet-coordinator postrm: a purge keeps /var/lib/repronet/coordinator
# (the leaderboards' history: remove it by hand) and the repronet user.
set -e
if [ "$1" = "purge" ]; then
	echo "repronet-coordinator: /var/lib/repronet/coordinator is kept (the network's records); remove it by hand if you mean to."
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
