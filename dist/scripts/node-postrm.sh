#!/bin/sh
# repronet-node postrm: purge removes the join token and the node's data
# (its identity, capsule cache, outbox and containerd state).
set -e
if [ "$1" = "purge" ]; then
	rm -f /etc/repronet/join.token
	rm -rf /var/lib/repronet/node /var/lib/repronet/containerd
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
